"""Every wait bound of the tests, defined once, with its reason (seconds).

A bound is a backstop that turns a hang into a failure, never a
synchronisation tool: a passing test does not wait for it, so a generous
bound costs nothing and a tight one fails on a loaded machine. The suite
runs on a 2-core machine, sometimes under load from other work.

The last section holds the few bounds that are what a test checks (a
guarantee of the library: how soon a death is reported, how soon the
processes of a dead learner are gone), not backstops. The timeouts that a
test gives a generator to see them run out (``timeout=0.5`` and the like)
are the inputs of what it checks, and stay beside their assertions.
"""

# how soon a fault must surface in the learner once it happened (a
# worker's exception, a death, a stall under test: the ``timeout=`` of the
# generators in the fault tests); what these tests check is the reporting
FAULT = 5.0

# ``timeout=`` of process generators in the tests that check what is
# delivered (data, order, restarts): a live worker is never that slow here
STEADY = 10.0

# ``shutdown_timeout=`` of the generators of the tests: a worker told to
# stop that has not stopped within it is terminated (SIGTERM); the tests
# check that none is left, not how long a stop takes
SHUTDOWN = 2.0

# ``shutdown_timeout=`` of the tests that read what each worker counted
# at a clean stop (its ``collected``, reported by its answer to close()):
# a live worker answers within a second or two, but on a loaded machine
# (two test processes, Ray's own) an answer once took over 5 s, the
# default, and the count was lost; a clean stop returns as soon as every
# worker has answered, so the bound costs nothing when they do
CLEAN_STOP = 60.0

# ``start_timeout=``: a spawned worker (a fresh interpreter) imports torch
# before its first fragment, seconds each on a busy 2-core machine
START = 120.0

# how long the processes that an env starts (an AsyncVectorEnv's) may take
# to start and hang, and the replacement of their worker to start and
# deliver, in tests/test_env_processes.py (a handshake through files,
# polled)
HUNG = 60.0

# ``timeout=`` of the generators that deliver on a CUDA device
# (tests/test_cuda.py): the learner's first copies to the device
# initialise CUDA there, and a GPU machine may be shared
CUDA_STEADY = 30.0

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

# one Python block of the README or of a documentation page run as a
# script: the slowest starts a local Ray and two Ray actors that import
# torch (about 20 s on an idle machine)
DOC_BLOCK = 240.0

# building the documentation site (``mkdocs build --strict``,
# tests/test_docs.py): the API reference and twelve notebooks rendered
# (10 to 15 s on an idle two-core machine)
DOCS_BUILD = 180.0

# notebooks: one cell, one whole notebook, a kernel's start, and the wait
# for a cell's last output after its reply (nbclient's iopub_timeout, 4 s
# by default, past which it drops the output without a word)
NOTEBOOK_CELL = 600
NOTEBOOK = 900
KERNEL_START = 120
NOTEBOOK_OUTPUT = 120

# a Python script that a test runs in a fresh interpreter (a subprocess's
# ``timeout=``): it imports torch and may start a few workers under
# forkserver or spawn, seconds each on a busy 2-core machine
SCRIPT = 180.0

# one step of tests/test_wheel.py: building the sdist and the wheel
# without an isolated environment, twine's check of both, making a virtual
# environment without pip, installing the wheel alone into it (about a
# second or two each on an idle machine)
PACKAGING = 120.0

# the demo as a script (``python -m rlplay.demo``): it trains CartPole
# (about 20 s on an idle machine)
DEMO = 300.0

# one dry run of a benchmark script (tests/test_benchmarks.py): a few
# seconds on an idle machine
BENCHMARK = 240.0

# joining what a test started itself (a thread, a helper process, a
# learner script) once it was told to stop or was killed: it ends at once
JOIN = 10.0

# how long conftest.py's autouse fixture waits, after a test, for the
# processes the test started to end (a worker torn down by close() ends
# at once; Ray may take a moment to know an actor dead)
REAPED = 5.0

# the soak of tests/test_restarts.py (200 batches over envs that crash at
# random: about 20 s on an idle machine): its pytest backstop
SOAK = 120.0

# the pytest backstop of a test whose waits are all bounded by FAULT but
# whose env stalls for a minute: an unbounded wait would sleep with it
STALLED = 30.0

# what a pytest backstop (``@pytest.mark.timeout``) adds to the bounds of
# the waits of the test it guards: its set-up and teardown around them
MARGIN = 60.0

# one query of Ray's actor table by conftest.py's process fixture (Ray's
# synchronous query has no deadline of its own), asked at most twice
GCS_QUERY = 30.0


# ---------------------------------------- what the tests check (guarantees) --

# a worker killed while its env's processes live is reported at once, and
# its whole process group is gone within GONE once it is retired or the
# learner dies (tests/test_env_processes.py)
REPORTED = 1.0
GONE = 1.0

# a learner killed outright: every worker it started is gone within
# ORPHANED, every other process it started (the resource tracker, the fork
# server) and every named semaphore it made within LEFT_OVER
# (tests/test_guarantees.py). The workers die by a signal the kernel sends
# at the learner's death; the fork server and the resource tracker notice
# the end of a pipe and exit as Python processes do (the fork server with
# torch imported): at a load of 16 on two cores that once took over 5 s,
# so LEFT_OVER checks that they end on their own, not how fast a loaded
# machine schedules them (the check returns as soon as they are gone)
ORPHANED = 2.0
LEFT_OVER = 30.0

# a node lost from a Ray cluster (its raylet SIGKILLed): its worker is
# reported dead within NODE_LOST; tests/cluster_nodes.py sets Ray's health
# checks to 3 missed checks of 0.5 s
NODE_LOST = 30.0
