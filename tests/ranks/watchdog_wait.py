"""One process, no MPI: an OpContext wait of 0.5 s whose poll either never returns ("stuck",
as a thread blocked inside MPI) or returns False until the deadline ("late": the normal
timeout), then sleeps SECONDS; prints what happened. Run by tests/test_watchdog.py."""
import sys
import threading
import time

from topocoll.collectives import watchdog
from topocoll.collectives.context import OpContext
from topocoll.collectives.errors import CollectiveTimeoutError

mode, after = sys.argv[1], float(sys.argv[2])
watchdog.start()  # as every communicator does
ctx = OpContext("all_reduce", 0.5)
print("waiting", flush=True)
try:
    if mode == "stuck":
        ctx.poll(lambda: threading.Event().wait(), lambda: "rank 2")
    else:
        ctx.poll(lambda: False, lambda: "rank 2")
except CollectiveTimeoutError as err:
    print(f"raised: {err}", flush=True)
time.sleep(after)
print("lived on", flush=True)
