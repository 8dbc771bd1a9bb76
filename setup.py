"""The one part of the build pyproject.toml cannot say: conf/ goes into the wheel as `tsformer/conf`.

An installed `tsformer-train` composes its configs from there (tsformer.config.config_dir); a checkout
keeps the one copy at the top of the repository, where `python train.py` reads it.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages("src"), "tsformer.conf"],
    package_dir={"": "src", "tsformer.conf": "conf"},
    package_data={"tsformer.conf": ["*.yaml", "**/*.yaml"]},
)
