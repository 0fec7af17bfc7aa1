"""`distppo status SWEEP`: where a sweep stands, from its storage alone (sweep/status.py).

    distppo status <storage>/<name> [--watch SECONDS] [--json] [--stale-after SECONDS]

Read-only: it never writes to the sweep, only tests whether its lease is held (sweep/lease.py
`held`), needs neither Ray nor the driver, and works on a running, finished or killed sweep,
local or on s3://.
"""
from __future__ import annotations

import argparse
import json
import time

from distppo.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="where a running, finished or killed sweep stands",
                       description=__doc__.splitlines()[0])
    p.add_argument("sweep", metavar="SWEEP", help="<storage>/<name>: a local folder or a URI "
                   "(s3://bucket/sweeps/NAME)")
    p.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                   help="print again every SECONDS until interrupted")
    p.add_argument("--json", action="store_true", help="one JSON object (per look) on stdout")
    p.add_argument("--stale-after", type=float, default=None, metavar="SECONDS",
                   help="where the sweep's lease cannot tell (none, an old or foreign one), the "
                        "driver counts as alive while a sweep file changed within this many "
                        "seconds (default: 300; Tune syncs results to object stores every few "
                        "minutes)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from distppo.sweep.status import STALE_AFTER_S, format_status, read_status
    stale = STALE_AFTER_S if args.stale_after is None else args.stale_after
    if args.watch is not None and args.watch <= 0:
        raise UserError(f"--watch must be > 0 seconds, got {args.watch:g}")
    if stale < 0:
        raise UserError(f"--stale-after must be >= 0 seconds, got {stale:g}")
    while True:
        status = read_status(args.sweep, stale)
        if args.json:
            print(json.dumps(status.to_dict()), flush=True)
        else:
            print(format_status(status), flush=True)
        if args.watch is None:
            return 0
        time.sleep(args.watch)
        if not args.json:
            print(flush=True)
