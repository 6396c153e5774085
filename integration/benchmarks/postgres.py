from benchmarks import _bench

x: int = _bench.f()
