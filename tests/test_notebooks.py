"""Execute every notebook in ``notebooks/`` and check the result it prints.

Each notebook ends by printing one line ``RESULT {json}``; the checks below
read it from the executed notebook's outputs. The notebooks run on a kernel
of this very interpreter (a kernel spec written to a temporary directory),
so that they see the same environment as the tests whatever kernels are
installed on the machine.

The executions are marked ``notebooks``: ``pytest -m "not notebooks"``
leaves them out. The structural checks (committed without outputs, only the
public API imported) are cheap and always run.
"""
import ast
import json
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
                    NOTEBOOK as NOTEBOOK_TIMEOUT, NOTEBOOK_CELL as CELL_TIMEOUT)

KERNEL_NAME = "rlplay-tests"
RESULT_PREFIX = "RESULT "

# modules a notebook may import from rlplay: the public API only
PUBLIC_MODULES = {
    "rlplay", "rlplay.engine", "rlplay.engine.rollout",
    "rlplay.engine.rollout.same", "rlplay.engine.rollout.single",
    "rlplay.engine.rollout.multi", "rlplay.engine.rollout.evaluate",
    "rlplay.engine.rollout.cluster", "rlplay.engine.rollout.episodic",
}

# notebooks that need an optional dependency (a module, or a tuple of
# modules): skipped without it
NEEDS = {"05_cluster": "ray", "07_episodes": "minari", "08_off_policy": "ray",
         "09_long_runs": "pygame",
         "10_pixels_and_physics": ("ale_py", "cv2", "mujoco")}

# the env steps per task of the notebooks that read RLPLAY_EXAMPLE_STEPS
# (their full runs take minutes per task): a brief run here, whose result
# is checked for its structure, not for learning
EXAMPLE_STEPS = 2048


def _check_solved(result):
    assert result["eval_return"] >= 450, (
        f"the evaluation return is {result['eval_return']:.1f}, expected at "
        f"least 450 on CartPole-v1")


def _check_memory(result):
    recurrent, feedforward = result["recurrent"], result["feedforward"]
    assert recurrent >= feedforward + 50 and recurrent >= 1.5 * feedforward, (
        f"the recurrent actor's return {recurrent:.1f} is not clearly above "
        f"the feed-forward one's {feedforward:.1f} on the partially "
        f"observed task")


def _check_structured(result):
    trained, untrained = result["trained_return"], result["untrained_return"]
    assert trained >= untrained + 0.5, (
        f"training did not clearly improve the greedy return: {trained:.2f} "
        f"after, {untrained:.2f} before")


def _check_episodes(result):
    assert result["eval_return"] >= 475, (
        f"the evaluation return is {result['eval_return']:.1f}, expected at "
        f"least 475 on CartPole-v1")
    assert result["dataset_episodes"] == 10, result


def _check_off_policy(result):
    assert result["dqn_eval"] >= 500 and result["dqn_steps"] <= 50_000, (
        f"DQN's greedy return is {result['dqn_eval']:.1f} after "
        f"{result['dqn_steps']} env steps, expected 500 within 50,000")
    assert result["sac_eval"] >= -200 and result["sac_steps"] <= 20_000, (
        f"SAC's evaluation return is {result['sac_eval']:.1f} after "
        f"{result['sac_steps']} env steps, expected -200 or more within "
        f"20,000")
    assert result["cluster_steps"] >= 4096, result
    assert result["cluster_versions"] > 1, result


def _check_long_runs(result):
    # stopped after batch 17, resumed from the checkpoint of batch 15
    assert result["resumed_from"] == 15 and result["first_resumed_batch"] \
        == 20, result
    assert result["seq_continues"] and result["generations"] == [1], result
    assert result["videos"] == 8, result  # one per evaluation
    assert result["eval_best_resumed"] > result["eval_first"], (
        f"the resumed run's best evaluation {result['eval_best_resumed']:.1f}"
        f" is not above the first one, {result['eval_first']:.1f}")


def _check_pixels_and_physics(result):
    # per task: the trailing shape and dtype of obs, and of act
    expected = {"HalfCheetah-v5": ([17], "torch.float64", [6], "torch.float32"),
                "Breakout": ([4, 84, 84], "torch.uint8", [], "torch.int64")}
    assert sorted(result) == sorted(expected), result
    for name, (obs_tail, obs_dtype, act_tail, act_dtype) in expected.items():
        run = result[name]
        (obs_shape, obs_type), (act_shape, act_type) = run["obs"], run["act"]
        T1, B = obs_shape[:2]
        assert [obs_shape[2:], obs_type] == [obs_tail, obs_dtype], (name, run)
        assert [act_shape, act_type] == [[T1, B, *act_tail], act_dtype], (
            name, run)
        # batches of (1 + T, B): the steps collected are the budget asked for
        assert run["env_steps"] == run["batches"] * (T1 - 1) * B \
            == EXAMPLE_STEPS, (name, run)
        assert run["losses_finite"] and run["returns_finite"], (name, run)
        assert run["train"] > 0 and run["startup"] > 0, (name, run)
        assert run["startup"] + run["wait"] + run["train"] <= run["wall"], (
            name, run)


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
    "10_pixels_and_physics": _check_pixels_and_physics,
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
    """Committed without outputs, opens with markdown, imports only the
    public API."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", (
        f"{path.name} must open with a markdown cell saying what it shows")
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert not cell.outputs and cell.execution_count is None, (
            f"{path.name}: cell {k} has outputs; commit notebooks without "
            f"outputs")
        private = [name for name in _rlplay_imports(cell.source)
                   if name not in PUBLIC_MODULES]
        assert not private, (
            f"{path.name}: cell {k} imports {private}; notebooks use only "
            f"{sorted(PUBLIC_MODULES)}")


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
def test_notebook_runs(path, kernel_spec_manager, monkeypatch):
    needs = NEEDS.get(path.stem, ())
    for module in (needs,) if isinstance(needs, str) else needs:
        pytest.importorskip(module)
    # the kernel inherits this process's environment when it starts
    monkeypatch.setenv("RLPLAY_EXAMPLE_STEPS", str(EXAMPLE_STEPS))
    nb = nbformat.read(path, as_version=4)
    km = AsyncKernelManager(kernel_name=KERNEL_NAME,
                            kernel_spec_manager=kernel_spec_manager)
    client = nbclient.NotebookClient(
        nb, km=km, timeout=CELL_TIMEOUT, startup_timeout=STARTUP_TIMEOUT,
        resources={"metadata": {"path": str(path.parent)}})
    # cleanup_kc: shut the kernel down at the end, even though the client
    # does not own its manager; a failing cell raises CellExecutionError
    # with the cell's traceback
    client.execute(cleanup_kc=True)
    result = _result(nb, path)
    print(f"{path.stem}: {result}")
    check = CHECKS.get(path.stem)
    if check is not None:
        check(result)
    check = OUTPUT_CHECKS.get(path.stem)
    if check is not None:
        check(nb, path)
