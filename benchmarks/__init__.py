"""Side-by-side measurements of ballast against its peers; scripts, never collected by pytest.

Each runs from a clone as `python benchmarks/NAME.py` or `python -m benchmarks.NAME`
(tests/test_benchmarks.py runs each at its smallest size); peers come with the `bench`
extra (`pip install -e '.[bench]'`).
"""
