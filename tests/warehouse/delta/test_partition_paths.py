"""The keys by which a multi-partition read finds each row's partition values: the shortest
tail of Spark's file URI that tells the files apart (``uri_suffix_keys``)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from warehouse.delta.partition_paths import uri_suffix_keys

# Partition values and file names with the characters Hive escaping and URIs treat apart.
SEGMENT = st.text(alphabet="ab1 +:%/=é'", min_size=1, max_size=6)


def spark_uri(location: str, authority: bool) -> str:
    """``location`` as Spark names a file: ``file:/`` or ``file:///``, then the path with
    ``%`` and spaces quoted and ``+``, ``:``, ``=`` and ``'`` raw, as Java's URI does
    (non-ASCII letters are quoted here; Java leaves them raw, and neither form changes
    the tail's segments)."""
    return ("file://" if authority else "file:") + quote(location, safe="/:+='")


def hive_dir(value: str) -> str:
    """A partition directory as a writer escapes it on disk (``/`` may not stay)."""
    return "p=" + value.replace("%", "%25").replace("/", "%2F")


@given(
    files=st.lists(st.tuples(SEGMENT, st.sampled_from(["part-0.parquet", "part-1.parquet"]))),
    authority=st.booleans(),
)
def test_keys_are_the_shortest_distinct_uri_tails(
    files: list[tuple[str, str]], authority: bool
) -> None:
    locations = sorted({f"/data/t/{hive_dir(value)}/{name}" for value, name in files})
    uris = [spark_uri(location, authority) for location in reversed(locations)]

    found = uri_suffix_keys(uris, locations)

    assert found is not None
    depth, keys = found
    assert len(set(keys)) == len(keys)
    for location, key in zip(locations, keys, strict=True):
        # The key is the tail of the file's own URI, in either form of its head.
        for head in (True, False):
            assert spark_uri(location, head).split("/")[-depth:] == key.split("/")
    if depth > 1:
        shorter = ["/".join(spark_uri(x, authority).split("/")[-(depth - 1) :]) for x in locations]
        assert len(set(shorter)) < len(shorter)


def test_uris_that_are_not_exactly_the_files_give_no_keys() -> None:
    locations = ["/t/p=a/part-0.parquet", "/t/p=b/part-0.parquet"]
    uris = [f"file://{location}" for location in locations]

    assert uri_suffix_keys(uris, locations) == (2, ["p=a/part-0.parquet", "p=b/part-0.parquet"])
    assert uri_suffix_keys(uris[:1], locations) is None
    assert uri_suffix_keys([*uris, "file:/t/p=c/part-0.parquet"], locations) is None
    assert uri_suffix_keys([*uris, uris[0]], locations) is None
    assert uri_suffix_keys(uris, [*locations, locations[0]]) is None
    # Files told apart only by the scheme's part of the URI: no key within the path.
    assert uri_suffix_keys(["file:/x"], ["/x"]) == (1, ["x"])


def test_spark_names_awkward_partition_files_so_that_keys_exist(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The assumption the engine's fast path rests on: ``inputFiles()`` decodes to the very
    locations it was given, for directories with spaces, colons, percent signs and '+'."""
    schema = T.StructType([T.StructField("id", T.LongType())])
    locations = []
    # Directory names as they are on disk: raw spaces, colons, '+' and 'é', and a Hive
    # escape's literal '%'.
    for index, value in enumerate(["2024-01-01 00%3A00%3A00", "x:y", "a+b c", "é"]):
        folder = tmp_path / f"_interval_start={value}"
        location = str(folder / "part-0.parquet")
        spark.createDataFrame([(index,)], schema).coalesce(1).write.parquet(str(folder / "w"))
        (next((folder / "w").glob("part-*.parquet"))).rename(location)
        locations.append(location)
    frame = spark.read.schema(schema).parquet(*locations)

    found = uri_suffix_keys(frame.inputFiles(), locations)

    assert found is not None and found[0] == 2
    rows = frame.selectExpr("id", "substring_index(_metadata.file_path, '/', -2) AS key").collect()
    assert {r.key: r.id for r in rows} == dict(zip(found[1], range(4), strict=True))
