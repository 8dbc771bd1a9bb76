"""Forecast new data with a trained model: `python predict.py MODEL DATA --output forecasts.csv` (see README)."""

import sys

from tsformer.predict import main

if __name__ == "__main__":
    sys.exit(main())
