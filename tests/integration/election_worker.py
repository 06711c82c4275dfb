"""A master's leader campaign in its own process, for the takeover tests.

``python -m tests.integration.election_worker ENDPOINTS CLUSTER_ID ADDRESS TTL_S``: campaigns,
prints ``leader <create_revision>`` once elected, then holds the leadership (renewing its
lease) until it is killed, or prints ``lost <reason>`` and exits 1 if it loses it.
"""

from __future__ import annotations

import asyncio
import sys

from mooncake_py.master.ha.election import LeaderElection


async def hold(endpoints: str, cluster_id: str, address: str, ttl_s: float) -> int:
    election = LeaderElection(endpoints, cluster_id, address, ttl_s=ttl_s)
    await election.campaign()
    print(f"leader {election.leader_revision}", flush=True)
    await election.wait_lost()
    print(f"lost {election.lost_reason}", flush=True)
    await election.close()
    return 1


if __name__ == "__main__":
    endpoints_arg, cluster_arg, address_arg, ttl_arg = sys.argv[1:5]
    sys.exit(asyncio.run(hold(endpoints_arg, cluster_arg, address_arg, float(ttl_arg))))
