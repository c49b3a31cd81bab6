"""Execute every notebook in ``notebooks/`` and check the result it prints.

Each notebook ends by printing one line ``RESULT {json}``; the checks below
read it from the executed notebook's outputs. Notebooks are committed
without outputs; what a full run reached (a return, a learning curve that
rises) is committed beside them, in ``notebooks/full_runs.json`` (the
RESULT of each notebook's last full run), and checked there without
running anything.

The suite executes every notebook with ``RLPLAY_QUICK=1``: each sizes its
training by it, so that every cell runs on a budget of seconds; the checks
of that run are those that hold at any budget (the keys of the result, a
resume that goes on from its checkpoint, a dataset's size).
``RLPLAY_NOTEBOOKS=full`` in the environment of the tests executes them on
their full budgets instead (minutes each), with every check.

The notebooks run on a kernel of this very interpreter (a kernel spec
written to a temporary directory), so that they see the same environment
as the tests whatever kernels are installed on the machine. The
executions are marked ``notebooks``: ``pytest -m "not notebooks"`` leaves
them out.
"""
import ast
import json
import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))

# bounds: one cell, one notebook, kernel start (bounds.py says why)
from bounds import (KERNEL_START as STARTUP_TIMEOUT,  # noqa: E402
                    NOTEBOOK as NOTEBOOK_TIMEOUT, NOTEBOOK_CELL as CELL_TIMEOUT,
                    NOTEBOOK_OUTPUT as OUTPUT_TIMEOUT)

KERNEL_NAME = "rlplay-tests"
RESULT_PREFIX = "RESULT "
# the tests execute the notebooks in full, or on a small budget
FULL = os.environ.get("RLPLAY_NOTEBOOKS") == "full"
# the RESULT of each notebook's last full run, by name
FULL_RUNS = json.loads((NOTEBOOK_DIR / "full_runs.json").read_text())

# modules a notebook may import from rlplay: the public API only
PUBLIC_MODULES = {
    "rlplay", "rlplay.engine", "rlplay.engine.rollout",
    "rlplay.engine.rollout.same", "rlplay.engine.rollout.single",
    "rlplay.engine.rollout.multi", "rlplay.engine.rollout.evaluate",
    "rlplay.engine.rollout.cluster", "rlplay.engine.rollout.episodic",
}

# notebooks that need an optional dependency (a module, or a tuple of
# modules; rlplay[video] installs `pygame` as pygame-ce): skipped without it
NEEDS = {"05_cluster": "ray", "07_episodes": "minari", "08_off_policy": "ray",
         "09_long_runs": "pygame", "11_many_agents": ("mpe2", "pymunk"),
         "12_pixels_and_physics": ("ale_py", "cv2", "mujoco"),
         "13_asynchronous_learning": "mujoco"}


# the checks of a notebook's result: ``full`` when it comes from a full
# run (committed, or executed with RLPLAY_NOTEBOOKS=full); what a run on a
# small budget cannot reach is checked on full runs only

def _check_solved(result, full):
    if full:
        assert result["eval_return"] >= 450, (
            f"the evaluation return is {result['eval_return']:.1f}, expected "
            f"at least 450 on CartPole-v1")


def _check_memory(result, full):
    recurrent, feedforward = result["recurrent"], result["feedforward"]
    if full:
        assert recurrent >= feedforward + 50 and \
            recurrent >= 1.5 * feedforward, (
                f"the recurrent actor's return {recurrent:.1f} is not "
                f"clearly above the feed-forward one's {feedforward:.1f} on "
                f"the partially observed task")


def _check_structured(result, full):
    trained, untrained = result["trained_return"], result["untrained_return"]
    if full:
        assert trained >= untrained + 0.5, (
            f"training did not clearly improve the greedy return: "
            f"{trained:.2f} after, {untrained:.2f} before")


def _check_episodes(result, full):
    if full:
        assert result["eval_return"] >= 475, (
            f"the evaluation return is {result['eval_return']:.1f}, expected "
            f"at least 475 on CartPole-v1")
    assert result["dataset_episodes"] == 10, result


def _check_off_policy(result, full):
    if full:
        assert result["dqn_eval"] >= 500 and \
            result["dqn_steps"] <= 50_000, (
                f"DQN's greedy return is {result['dqn_eval']:.1f} after "
                f"{result['dqn_steps']} env steps, expected 500 within "
                f"50,000")
        assert result["sac_eval"] >= -200 and \
            result["sac_steps"] <= 20_000, (
                f"SAC's evaluation return is {result['sac_eval']:.1f} after "
                f"{result['sac_steps']} env steps, expected -200 or more "
                f"within 20,000")
        assert result["cluster_steps"] >= 4096, result
    assert result["cluster_versions"] > 1, result


def _check_long_runs(result, full):
    # stopped after batch 17, resumed from the checkpoint of batch 15
    assert result["resumed_from"] == 15 and result["first_resumed_batch"] \
        == 20, result
    assert result["seq_continues"] and result["generations"] == [1], result
    assert result["videos"] == 8, result  # one per evaluation
    if full:
        assert result["eval_best_resumed"] > result["eval_first"], (
            f"the resumed run's best evaluation "
            f"{result['eval_best_resumed']:.1f} is not above the first one, "
            f"{result['eval_first']:.1f}")


def _check_curriculum(result, full):
    # quick: one seed, 48 batches (the full run, five seeds, is the figure)
    assert result["schedule_last_control"] == result["n_levels"] - 1, result
    assert result["schedule_solved"] is not None, (
        f"the schedule did not solve the hardest distance in "
        f"{result['batches']} batches: {result}")
    assert result["hardest_solved"] == [None] * result["seeds"] and \
        result["hardest_best"] < 0.5, (
        f"the hardest distance was learned without the schedule: {result}")


def _check_many_agents(result, full):
    # quick: a few batches, too few to learn; what they show is
    # the layout: every batch of the budget collected, every agent living
    # its whole episode (`episode_length` steps) in it, finite returns
    assert result["batches"] == result["n_batches"], result
    assert result["agent_steps"] == \
        result["batches"] * result["steps_per_batch"], result
    assert result["agent_episodes"] * result["episode_length"] == \
        result["agent_steps"], result
    assert result["returns_finite"], result
    assert result["kaz_absent_after_end"] and result["kaz_final_is_last_obs"], (
        result)
    if not full:
        return
    assert result["last_return"] >= result["first_return"] + 2, (
        f"the mean agent return went from {result['first_return']:.1f} to "
        f"{result['last_return']:.1f}: it did not clearly rise")


def _check_pixels_and_physics(result, full):
    # per task: the trailing shape and dtype of obs, and of act
    expected = {"HalfCheetah-v5": ([17], "torch.float64", [6], "torch.float32"),
                "Breakout": ([4, 84, 84], "torch.uint8", [], "torch.int64")}
    assert sorted(result) == sorted(["quick", *expected]), result
    for name, (obs_tail, obs_dtype, act_tail, act_dtype) in expected.items():
        run = result[name]
        (obs_shape, obs_type), (act_shape, act_type) = run["obs"], run["act"]
        T1, B = obs_shape[:2]
        assert [obs_shape[2:], obs_type] == [obs_tail, obs_dtype], (name, run)
        assert [act_shape, act_type] == [[T1, B, *act_tail], act_dtype], (
            name, run)
        # batches of (1 + T, B): the steps collected are the budget asked for
        assert run["env_steps"] == run["batches"] * (T1 - 1) * B, (name, run)
        if not full:  # a couple of batches: 2048 env steps per task
            assert run["env_steps"] == 2048, (name, run)
        assert run["losses_finite"] and run["returns_finite"], (name, run)
        assert run["train"] > 0 and run["startup"] > 0, (name, run)
        assert run["startup"] + run["wait"] + run["train"] <= run["wall"], (
            name, run)


def _check_asynchronous_learning(result, full):
    # synchronous PPO (same.rollout, every batch of lag 0) and APPO twice
    # (multi.rollout, one worker running ahead: one shared buffer, lags up to
    # 1; three, lags up to 3), on the same budget of env steps, one fragment
    # per batch
    runs = ("sync", "appo_lag1", "appo_lag3")
    assert sorted(result) == sorted(["batch", "quick", *runs]), result
    assert [result[name]["max_lag"] for name in runs] == [0, 1, 3], result
    for name in runs:
        run = result[name]
        assert run["env_steps"] == run["batches"] * result["batch"], (name, run)
        assert run["env_steps"] == result["sync"]["env_steps"], (name, result)
        if not full:  # a couple of batches
            assert run["batches"] == 2, (name, run)
        assert run["losses_finite"] and run["returns_finite"], (name, run)
        assert run["startup"] + run["wait"] + run["train"] <= run["wall"], (
            name, run)
        for share in ("wait_share", "worker_wait_share", "worker_idle_share"):
            assert 0 <= run[share] <= 1, (name, share, run)
        # the lag histogram: every batch trained on, none staler than its
        # max_lag (those are dropped)
        lags = {int(lag): count for lag, count in run["lags"].items()}
        assert sum(lags.values()) == run["batches"], (name, run)
        assert 0 <= min(lags) and max(lags) <= run["max_lag"], (name, run)
    assert result["sync"]["lags"] == {"0": result["sync"]["batches"]}, result
    assert result["sync"]["dropped"] == 0, result
    if not full:
        return
    # the worker ran ahead: most batches were collected by parameters older
    # than those trained, as old as the buffers allow; and the learner
    # waited for data a smaller share of its time than the synchronous one,
    # which waits for every collection
    for name in ("appo_lag1", "appo_lag3"):
        run = result[name]
        behind = run["lags"].get(str(run["max_lag"]), 0)
        assert 2 * behind >= run["batches"], (name, run)
        assert run["wait_share"] < result["sync"]["wait_share"] / 2, (
            name, result)
    # the rise of the mean return, first tenth of the episodes to the last,
    # that each clearly exceeds: about half of what it reached in the full
    # run committed (1082, 1059 and 802)
    rises = {"sync": 500, "appo_lag1": 500, "appo_lag3": 400}
    for name, rise in rises.items():
        run = result[name]
        assert run["return_last"] >= run["return_first"] + rise, (
            f"{name}: the mean return went from {run['return_first']:.1f} to "
            f"{run['return_last']:.1f}: it did not rise by {rise}")


CHECKS = {
    "01_quickstart": _check_solved,
    "02_double_buffered_ppo": _check_solved,
    "03_many_actors_memory": _check_memory,
    "04_structured_spaces": _check_structured,
    "05_cluster": _check_solved,
    "06_vector_envs": _check_solved,
    "07_episodes": _check_episodes,
    "08_off_policy": _check_off_policy,
    "09_long_runs": _check_long_runs,
    "10_curriculum": _check_curriculum,
    "11_many_agents": _check_many_agents,
    "12_pixels_and_physics": _check_pixels_and_physics,
    "13_asynchronous_learning": _check_asynchronous_learning,
}


def _quiet_with_plots(nb, path):
    """Nothing on stderr (no warnings of the libraries it starts: Ray's,
    tqdm's) and at least one figure."""
    noise = [output.get("text", "")[:300] for cell in nb.cells
             for output in cell.get("outputs", ())
             if output.get("output_type") == "stream"
             and output.get("name") == "stderr"]
    assert not noise, f"{path.name} printed on stderr: {noise}"
    figures = [output for cell in nb.cells
               for output in cell.get("outputs", ())
               if "image/png" in output.get("data", {})]
    assert figures, f"{path.name} shows no plot"


# checks of the executed notebook's outputs, beside its RESULT
OUTPUT_CHECKS = {"08_off_policy": _quiet_with_plots}


def _ids(path):
    return path.stem


def test_notebooks_exist():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"
    # a renamed notebook must not lose its check silently
    missing = sorted(set(CHECKS) - {path.stem for path in NOTEBOOKS})
    assert not missing, f"checked notebooks not found: {missing}"


def _rlplay_imports(source):
    # drop IPython magics (%matplotlib ...) so that the cell parses
    lines = [line for line in source.splitlines()
             if not line.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            names += [f"{node.module}.{alias.name}" for alias in node.names
                      if f"{node.module}.{alias.name}" in PUBLIC_MODULES]
        else:
            continue
        yield from (name for name in names
                    if name == "rlplay" or name.startswith("rlplay."))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_is_clean(path):
    """Opens with markdown, imports only the public API, is committed
    without outputs."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", (
        f"{path.name} must open with a markdown cell saying what it shows")
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for k, cell in enumerate(code, 1):
        private = [name for name in _rlplay_imports(cell.source)
                   if name not in PUBLIC_MODULES]
        assert not private, (
            f"{path.name}: code cell {k} imports {private}; notebooks use "
            f"only {sorted(PUBLIC_MODULES)}")
        assert not cell.outputs and cell.execution_count is None, (
            f"{path.name}: code cell {k} has outputs; commit notebooks "
            f"without them (their full run's result goes in "
            f"notebooks/full_runs.json)")


@pytest.mark.parametrize("name", sorted(FULL_RUNS))
def test_the_full_run_committed_passes_every_check(name):
    """The RESULT of a notebook's last full run (notebooks/full_runs.json)
    reaches what a full run must (a return, a margin, a budget)."""
    assert name in CHECKS, f"{name}: no such notebook is checked"
    result = FULL_RUNS[name]
    assert result["quick"] is False, (
        f"{name}: the committed result is a quick run's; commit a full "
        f"run's")
    CHECKS[name](result, full=True)


@pytest.fixture(scope="module")
def kernel_spec_manager(tmp_path_factory):
    """A kernel spec that runs this interpreter, in a private directory."""
    kernels = tmp_path_factory.mktemp("kernels")
    spec_dir = kernels / KERNEL_NAME
    spec_dir.mkdir()
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher",
                 "-f", "{connection_file}"],
        "display_name": f"rlplay tests ({sys.executable})",
        "language": "python",
    }
    if not FULL:  # every notebook sizes its training by it
        spec["env"] = {"RLPLAY_QUICK": "1"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(kernels)],
                             ensure_native_kernel=False)


def _result(nb, path):
    """The JSON of the last ``RESULT`` line the notebook printed."""
    found = None
    for cell in nb.cells:
        for output in cell.get("outputs", ()):
            if output.get("output_type") != "stream" \
                    or output.get("name") != "stdout":
                continue
            for line in output.get("text", "").splitlines():
                if line.startswith(RESULT_PREFIX):
                    found = line[len(RESULT_PREFIX):]
    assert found is not None, (
        f"{path.name} printed no line starting with {RESULT_PREFIX!r}")
    return json.loads(found)


@pytest.mark.notebooks
@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_runs(path, kernel_spec_manager):
    needs = NEEDS.get(path.stem, ())
    for module in [needs] if isinstance(needs, str) else needs:
        pytest.importorskip(module)
    nb = nbformat.read(path, as_version=4)
    km = AsyncKernelManager(kernel_name=KERNEL_NAME,
                            kernel_spec_manager=kernel_spec_manager)
    client = nbclient.NotebookClient(
        nb, km=km, timeout=CELL_TIMEOUT, startup_timeout=STARTUP_TIMEOUT,
        iopub_timeout=OUTPUT_TIMEOUT, raise_on_iopub_timeout=True,
        resources={"metadata": {"path": str(path.parent)}})
    # cleanup_kc: shut the kernel down at the end, even though the client
    # does not own its manager; a failing cell raises CellExecutionError
    # with the cell's traceback; a cell whose output is still on its way
    # after its reply is waited for (on a loaded machine, past nbclient's
    # 4 s default: the output, a RESULT line with it, was dropped) and
    # a wait past OUTPUT_TIMEOUT fails the test by name
    client.execute(cleanup_kc=True)
    result = _result(nb, path)
    print(f"{path.stem}: {result}")
    # the result of the full run committed says what to print
    committed = FULL_RUNS.get(path.stem)
    if committed is not None:
        assert set(result) == set(committed), (sorted(result),
                                               sorted(committed))
    assert result["quick"] is not FULL
    CHECKS[path.stem](result, full=FULL)
    check = OUTPUT_CHECKS.get(path.stem)
    if check is not None:
        check(nb, path)
