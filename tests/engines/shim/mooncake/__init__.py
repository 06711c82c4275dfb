"""Upstream's top-level ``mooncake`` package name, resolved to mooncake-py for engine tests.

Engines import ``from mooncake.store import MooncakeDistributedStore, ReplicateConfig``; this
package sits on ``sys.path`` of the engine test processes only, so their store modules run
unmodified against mooncake-py. It is not installed, and the other upstream modules
(``mooncake.engine``, ``mooncake.allocator``, ...) are deliberately absent: an engine path that
needs them fails with ImportError, as it would without Mooncake's transfer engine.
"""
