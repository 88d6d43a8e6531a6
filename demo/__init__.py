"""Demo tooling: TPC-H masters and Zipf-skewed stream files, and preparing them as a
warehouse's input (``enrich demo-data``). Used by the demo, the tests and the benchmarks."""
