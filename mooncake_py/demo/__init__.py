"""The end-to-end demo: what KV sessions buy a serving fleet, on one synthetic chat trace.

An embedded master (or an existing one), two engine-worker processes that host the store's
memory and serve turns through :class:`~mooncake_py.connector.KVConnector`, and a coordinator
that replays the same trace under plain LRU, under KV sessions and (unless
``DemoConfig.disk_tier`` is off) under plain LRU with a disk tier below the same memory, then
writes summary tables, a markdown report and a plot. Run it with ``python -m mooncake_py.demo`` (or
``mooncake-py demo``); from code::

    from mooncake_py.demo import DemoConfig, run
    result = run(DemoConfig(out_dir=Path("demo-output")))
    result.policy("sessions").live_hit_rate
"""

from mooncake_py.demo.runner import DemoConfig, DemoError, DemoResult, run
from mooncake_py.demo.trace import TraceConfig

__all__ = ["DemoConfig", "DemoError", "DemoResult", "TraceConfig", "run"]
