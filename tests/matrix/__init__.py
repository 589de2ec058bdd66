"""Data and logic behind `specverify matrix` that live with the tests: the feature map
(features.toml, classify.py) and the per-platform expected failures and skips
(tests/expectations/*.toml, expectations.py). The conftest calls both at collection."""
