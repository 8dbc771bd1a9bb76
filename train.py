"""Train, test and export one experiment: `python train.py model=enc_dec` (see conf/ and README)."""

from tsformer.train import main

if __name__ == "__main__":
    main()
