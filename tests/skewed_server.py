"""`python -m server` on a host whose wall clock is off by `SKEW_S` seconds (monotonic
time untouched): the multi-instance tests' stand-in for a host without NTP."""

import os
import runpy
import time

if __name__ == "__main__":
    skew_s = float(os.environ.get("SKEW_S", "0"))
    true_ns, true_time = time.time_ns, time.time
    time.time_ns = lambda: true_ns() + int(skew_s * 1e9)
    time.time = lambda: true_time() + skew_s
    runpy.run_module("server", run_name="__main__", alter_sys=True)
