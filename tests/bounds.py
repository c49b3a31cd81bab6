"""Every wait bound of the tests, defined once, with its reason (seconds).

A bound is a backstop that turns a hang into a failure, never a
synchronisation tool: a passing test does not wait for it, so a generous
bound costs nothing and a tight one fails on a loaded machine. The suite
runs on a 2-core machine, sometimes under load from other work.
"""

# how soon a fault must surface in the learner once it happened (a
# worker's exception, a death, a stall under test: the ``timeout=`` of the
# generators in the fault tests); what these tests check is the reporting
FAULT = 5.0

# ``timeout=`` of process generators in the tests that check what is
# delivered (data, order, restarts): a live worker is never that slow here
STEADY = 10.0

# ``start_timeout=``: a spawned worker (a fresh interpreter) imports torch
# before its first fragment, seconds each on a busy 2-core machine
START = 120.0

# how long the processes that an env starts (an AsyncVectorEnv's) may take
# to start and hang, in tests/test_env_processes.py (a handshake through
# files, polled)
HUNG = 60.0

# the Ray actors of the tests: ``timeout=`` of the tests that check what is
# delivered (a Ray worker on a loaded machine can go without CPU for longer
# than FAULT), and each wait of tests/cluster_nodes.py
RAY_STEADY = 60.0

# how long a Ray actor may take to start (``start_timeout``, and the
# deadlines of tests that wait for one, a replacement on another node
# included): at Ray's default nice 15, under two CPU hogs at nice 0,
# importing torch there took longer than 60 s (conftest.py runs them at
# nice 0); the tests check fragments, order and restarts, not how fast Ray
# starts a process, and the bound stays finite
RAY_START = 240.0

# a killed worker's replacement delivers within this bound, for multi and
# cluster (a new Ray actor process took over 60 s under CPU hogs); finite,
# so that a replacement that never delivers is an error, not a hang
REPLACEMENT = 300.0

# the whole of tests/cluster_nodes.py: a guard against a hang (what is
# timed there is the detection of a lost node); starting three Ray nodes
# on a busy two-core machine takes minutes
CLUSTER_SCRIPT = 480.0

# one part of the long-run script of tests/test_long_runs.py: a spawned
# worker and evaluator, 30 batches and PPO updates, six evaluations (a few
# seconds on an idle machine)
LONG_RUN_PART = 300.0

# one Python block of the README run as a script: the slowest starts a
# local Ray and two Ray actors that import torch (about 20 s on an idle
# machine)
README_BLOCK = 240.0

# notebooks: one cell, one whole notebook, a kernel's start
NOTEBOOK_CELL = 600
NOTEBOOK = 900
KERNEL_START = 120

# one query of Ray's actor table by conftest.py's process fixture (Ray's
# synchronous query has no deadline of its own), asked at most twice
GCS_QUERY = 30.0
