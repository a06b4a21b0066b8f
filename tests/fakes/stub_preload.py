"""A stand-in for `vllm preload` (weight-cache daemons) for the plugin's lifecycle tests.

The real daemons need CUDA (vLLM raises UnsupportedPlatformForIPCError elsewhere), so this
stands in: like vllm/entrypoints/cli/preload.py it starts one child per rank (spawned, in the
parent's process group), binds a Unix socket per rank in --weight-cache-socket-dir, answers
/health on --weight-cache-health-port once every rank is up, and writes vLLM-format log lines.

Usage: python stub_preload.py --model M [--tensor-parallel-size N] --weight-cache-socket-dir D
         --weight-cache-health-port P [--load-seconds S] [--fail-with ERROR_NAME] [--pid-file F]

--fail-with makes the daemons exit 1 during start-up after logging that error, as vLLM does
for a platform or quantization that cannot share weights (weight_cache/protocol.py).
--pid-file appends each process's pid, so a test can check that none outlives the teardown.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def info(who: str, source: str, message: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stdout.write(f"({who} pid={os.getpid()}) {level} {stamp} [{source}] {message}\n")
    sys.stdout.flush()


def rank_main(rank: int, socket_dir: str, load_s: float) -> None:
    """One daemon rank: load (sleep), bind its socket, serve until killed."""
    who = f"vllm-weight-cache-target-{rank}"
    time.sleep(load_s)
    info(who, "daemon.py:296", f"Weight cache target daemon rank {rank} loaded model "
                               "(0.25 GiB allocated, 0.50 GiB reserved)")
    path = os.path.join(socket_dir, f"vllm_weight_cache_GPU-stub-{rank}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    info(who, "daemon.py:357", f"Weight cache target daemon rank {rank} serving on {path}")
    while True:
        conn, _ = server.accept()
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--weight-cache-socket-dir", required=True)
    parser.add_argument("--weight-cache-health-port", type=int, required=True)
    parser.add_argument("--weight-cache-health-host", default="127.0.0.1")
    parser.add_argument("--load-seconds", type=float, default=0.3)
    parser.add_argument("--fail-with", default=None)
    parser.add_argument("--pid-file", default=None)
    args, _ = parser.parse_known_args()
    info("APIServer", "api_utils.py:286", f"non-default args: {{'model': '{args.model}'}}")
    if args.fail_with:
        info("APIServer", "preload.py:167", f"{args.fail_with}: stand-in start-up failure", "ERROR")
        sys.exit(1)
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, args.weight_cache_socket_dir, args.load_seconds))
             for r in range(args.tensor_parallel_size)]
    for proc in procs:
        proc.start()
    if args.pid_file:
        with open(args.pid_file, "a") as fh:
            fh.write("".join(f"{p}\n" for p in [os.getpid(), *(proc.pid for proc in procs)]))
    sockets = args.tensor_parallel_size

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            up = len([f for f in os.listdir(args.weight_cache_socket_dir) if f.endswith(".sock")])
            self.send_response(200 if self.path == "/health" and up == sockets else 503)
            self.end_headers()

        def log_message(self, format: str, *a: object) -> None:  # noqa: A002 - http.server API
            pass

    httpd = ThreadingHTTPServer((args.weight_cache_health_host, args.weight_cache_health_port), Health)
    info("APIServer", "preload.py:318", "===== Weight cache daemon READY: node 0/1 serving "
                                        f"{sockets} local rank(s) x 1 role(s) in {args.weight_cache_socket_dir} =====")
    httpd.serve_forever()


if __name__ == "__main__":
    main()
