"""Test matrix of the byteps monorepo: `nox` runs it all, `nox -s demo` runs the demo job.

Every session installs built wheels, never the source trees, so a test also
proves that a package installs on its own and declares its dependencies.
A session builds only the wheels it installs (and their byteps siblings),
each once per state of what builds it, kept in .nox/_wheels/<package>/<hash>/
across runs; missing wheels are built side by side, in one build
environment, with CMake build folders kept in .nox/_build/ so that an
unchanged C++ file is not compiled again (docs/install.md, "How fast the
first command is"). `nox -s wheels` also puts every wheel into dist/, where
`pip install --find-links dist byteps-<x>` finds them, and the install-*
sessions prove exactly that command.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import nox

ROOT = pathlib.Path(__file__).parent
# Every folder under packages/ with a pyproject.toml is one distribution.
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())
# Pinned: any other torch spec pulls several GB of CUDA wheels.
TORCH = "torch==2.13.0"
# Pinned like torch: the TensorFlow the tf adapter is tested with (CPU build, ~35 s to install).
TENSORFLOW = "tensorflow-cpu==2.21.0"
#: Keras 2 for TensorFlow 2.21 (TF_USE_LEGACY_KERAS=1); installed without its dependency on the full
#: "tensorflow" distribution, which would land a second TensorFlow over tensorflow-cpu's files.
TF_KERAS = "tf-keras==2.21.0"
# MXNet 1.9 needs numpy < 1.24 on Python 3.11; anything installed after it may
# upgrade numpy and break `import mxnet`, so its session installs all in one pip call.
MXNET = ("mxnet==1.9.1", "numpy==1.23.5", "scikit-learn<1.4", "scipy<1.12")
FRAMEWORK_MODULES = ["torch", "tensorflow", "mxnet"]
# The distributions that bring a deep-learning framework: no byteps package may pull one in.
FRAMEWORK_DISTRIBUTIONS = {"torch", "tensorflow", "tensorflow-cpu", "keras", "mxnet"}
# The one version of every byteps package: each pyproject's version and each pin on a
# sibling (`~=VERSION`) must agree with it (checked by `lint` and before every wheel build).
VERSION_FILE = ROOT / "VERSION"
# Where `nox -s wheels` puts the wheels for `pip install --find-links dist ...`.
DIST = ROOT / "dist"
#: Each package's wheel, one folder per state of what builds it (docs/install.md).
WHEEL_CACHE = ROOT / ".nox" / "_wheels"
#: The build environment and the packages' CMake build folders, kept between runs.
BUILD_ROOT = ROOT / ".nox" / "_build"
#: Everything any package's [build-system] requires (checked by `lint`): one environment builds them all.
BUILD_REQUIREMENTS = ("scikit-build-core>=0.10", "pybind11>=2.12", "hatchling>=1.18")

nox.options.sessions = [
    "lint",
    "wheels",
    "tests-testkit",
    "tests-transport",
    "tests-common",
    "tests-server",
    "tests-launcher",
    "tests-torch",
    "tests-tf",
    "tests-mxnet",
    "tests-engines",
    "install-server",
    "install-torch",
]
nox.options.error_on_missing_interpreters = True


# Distributions whose modules are not named after them (first: the one holding _C).
MODULES = {"byteps-tf": ("tensorflow", "keras")}
# Pure-Python distributions: byteps-testkit is test support (free ports, real jobs,
# process clean-up) that only starts byteps' programs, so it has no _C to check.
PURE_PYTHON = {"byteps-testkit"}
# What every test session installs beside the package under test (no package depends on it).
TESTKIT = "byteps-testkit"


def _module_name(package: str) -> str:
    return MODULES.get(package, (package.split("-", 1)[1],))[0]


def _wheel_inputs(base: pathlib.Path):
    """The files of one package folder that end up in (or build) its wheel."""
    for name in ("pyproject.toml", "CMakeLists.txt", "README.md"):
        if (base / name).is_file():  # a pure-Python package (byteps-testkit) has no CMakeLists.txt
            yield base / name
    for tree in ("src", "csrc", "cmake"):
        for path in sorted((base / tree).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
                yield path


def _pyproject_list(package: str, key: str) -> list:
    """The one-line list ``key = [...]`` of a package's pyproject.toml (build requires, dependencies)."""
    text = (ROOT / "packages" / package / "pyproject.toml").read_text()
    found = re.search(rf"^{key}\s*=\s*\[(.*)\]\s*$", text, re.MULTILINE)
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def _siblings(package: str) -> list:
    """The byteps packages ``package`` depends on."""
    return [re.match(r"byteps-[a-z]+", spec).group(0) for spec in _pyproject_list(package, "dependencies")
            if spec.startswith("byteps-")]


def _with_siblings(packages) -> list:
    """``packages`` and every byteps package they need, each once."""
    wanted, queue = [], list(packages)
    while queue:
        package = queue.pop(0)
        if package not in wanted:
            wanted.append(package)
            queue.extend(_siblings(package))
    return wanted


def _build_inputs(package: str) -> list:
    """What builds a package's wheel: its own files, and byteps-common's CMake module and C++ headers
    for an extension that compiles against them (its CMakeLists.txt names ../byteps-common)."""
    base = ROOT / "packages" / package
    inputs = list(_wheel_inputs(base))
    cmake = base / "CMakeLists.txt"
    if package != "byteps-common" and cmake.is_file() and "../byteps-common" in cmake.read_text():
        common = ROOT / "packages" / "byteps-common"
        inputs += sorted(p for tree in ("cmake", "csrc/include") for p in (common / tree).rglob("*") if p.is_file())
    return inputs


def _input_hash(package: str) -> str:
    digest = hashlib.sha256(f"{sys.version_info[:2]} {BUILD_REQUIREMENTS}".encode())
    for path in _build_inputs(package):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _valid_version(version: str) -> str:
    # Three numbers, so that a sibling pin `~=X.Y.Z` means "X.Y.Z or a later X.Y.*".
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"a byteps version is MAJOR.MINOR.PATCH, not {version!r}")
    return version


def _version() -> str:
    return _valid_version(VERSION_FILE.read_text().strip())


def _version_mismatches(version: str) -> list:
    """Every line of a pyproject.toml that disagrees with VERSION: its own version or a pin on a sibling.

    Read line by line, not as TOML: the same patterns are what `set-version`
    rewrites, and nox may run on a Python without tomllib.
    """
    wrong = []
    for package in PACKAGES:
        path = ROOT / "packages" / package / "pyproject.toml"
        own_versions = 0
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            own = re.match(r'version\s*=\s*"([^"]*)"', line)
            if own:
                own_versions += 1
                if own.group(1) != version:
                    wrong.append(f'{where}: version "{own.group(1)}", VERSION says "{version}"')
            if re.match(r"\s*name\s*=", line):  # the package's own name, not a requirement
                continue
            for name, spec in re.findall(r'"(byteps-[a-z]+)([^"]*)"', line):
                if spec.split(";")[0].strip() != f"~={version}":
                    wrong.append(f'{where}: "{name}{spec}" should be "{name}~={version}"')
        if own_versions != 1:
            wrong.append(f"{path.relative_to(ROOT)}: {own_versions} `version = ` lines, expected one (not dynamic)")
    return wrong


def _check_versions(session: nox.Session) -> None:
    wrong = _version_mismatches(_version())
    if wrong:
        session.error("versions disagree with VERSION (`nox -s set-version -- X.Y.Z` rewrites them all):\n  "
                      + "\n  ".join(wrong))


def _build_python(session: nox.Session) -> str:
    """The one environment every wheel is built in (the build requirements of every package), made once."""
    env = BUILD_ROOT / "env"
    python = env / "bin" / "python"
    stamp = env / "requirements.txt"
    if not (python.exists() and stamp.exists() and stamp.read_text() == "\n".join(BUILD_REQUIREMENTS)):
        shutil.rmtree(env, ignore_errors=True)
        # virtualenv, as nox's own venvs: it comes with nox, where a system Python may lack ensurepip.
        session.run(sys.executable, "-m", "virtualenv", "-q", str(env), external=True, silent=True)
        session.run(str(python), "-m", "pip", "install", "-q", *BUILD_REQUIREMENTS, external=True, silent=True)
        stamp.write_text("\n".join(BUILD_REQUIREMENTS))
    return str(python)


def _wheels(session: nox.Session, packages) -> dict:
    """The wheel of each package, built if no wheel of its current inputs is kept; {package: path}.

    Missing wheels are built side by side (each CMake build also uses every
    core), without build isolation, each in its own kept build folder.
    """
    folders = {package: WHEEL_CACHE / package / _input_hash(package) for package in packages}
    missing = [package for package, folder in folders.items() if not (folder / ".complete").exists()]
    if missing:
        _check_versions(session)
        python = _build_python(session)
        session.log(f"building {len(missing)} wheel(s): {', '.join(missing)}")
        running = []
        for package in missing:
            shutil.rmtree(folders[package], ignore_errors=True)
            folders[package].mkdir(parents=True)
            log = open(folders[package] / "build.log", "wb")
            command = [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                       "--wheel-dir", str(folders[package]), "-C", f"build-dir={BUILD_ROOT / package}",
                       str(ROOT / "packages" / package)]
            running.append((package, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
        failed = []
        for package, proc, log in running:
            proc.wait()
            log.close()
            if proc.returncode:
                failed.append(package)
                session.log((folders[package] / "build.log").read_text(errors="replace")[-4000:])
            else:
                (folders[package] / ".complete").touch()
        if failed:
            session.error(f"wheel build failed: {', '.join(failed)} (logs above, and build.log under {WHEEL_CACHE})")
        for package in missing:
            _prune(package, keep=folders[package])
    return {package: _wheel(folder, package) for package, folder in folders.items()}


def _prune(package: str, keep: pathlib.Path, kept: int = 3) -> None:
    """Drop all but the newest ``kept`` wheels of a package (source edits leave old ones behind)."""
    older = sorted((f for f in (WHEEL_CACHE / package).iterdir() if f != keep), key=lambda f: f.stat().st_mtime)
    for folder in older[: max(len(older) - (kept - 1), 0)]:
        shutil.rmtree(folder, ignore_errors=True)


def _wheel(folder: pathlib.Path, package: str) -> pathlib.Path:
    found = sorted(folder.glob(package.replace("-", "_") + "-*.whl"))
    if len(found) != 1:
        raise RuntimeError(f"expected one wheel of {package} in {folder}, found {found}")
    return found[0]


def _dist(session: nox.Session) -> pathlib.Path:
    """Every package's wheel, copied into dist/ in place of any older byteps wheels there."""
    built = _wheels(session, PACKAGES)
    DIST.mkdir(exist_ok=True)
    for package in PACKAGES:
        for old in DIST.glob(package.replace("-", "_") + "-*.whl"):
            old.unlink()
        shutil.copy2(built[package], DIST)
    return DIST


def _install(session: nox.Session, *packages: str, extra: tuple = ()) -> None:
    """Install the given byteps wheels (pip takes their byteps siblings from the same builds) and ``extra``.

    In a reused venv (`nox -r`, or a session with reuse_venv) nothing is
    installed when the very same wheels and requirements already are.
    """
    built = _wheels(session, _with_siblings(packages))
    links = [arg for path in sorted(built.values()) for arg in ("--find-links", str(path.parent))]
    arguments = [*links, *(str(built[p]) for p in packages), *extra]
    # The install's own arguments name every wheel (a wheel's folder is its inputs' hash): the stamp.
    stamp = pathlib.Path(session.virtualenv.location) / "byteps-installed.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(arguments):
        session.log("byteps wheels and requirements already installed in this venv")
        return
    # Every byteps wheel is version 0.1.0 whatever its source state: in a reused venv pip
    # would keep the stale copies as "already satisfied", so they all go first and pip resolves
    # them again from these builds.
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *PACKAGES, silent=True)
    session.install(*arguments)
    stamp.write_text("\n".join(arguments))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, the performance reference's check, the refusals' check, versions, build requirements, and no
    byteps/__init__.py."""
    session.install("ruff")
    session.run("ruff", "check", "packages", "benchmarks", "examples", "noxfile.py")
    # docs/performance.md stays a reference: every figure names the command that makes it, under 300 lines.
    session.run("python", str(ROOT / "benchmarks" / "check_performance_reference.py"))
    # docs/horovod-compatibility.md lists every raise NotImplementedError(...) of the packages, one row each.
    session.run("python", str(ROOT / "benchmarks" / "check_refusals.py"))
    _check_versions(session)
    unbuilt = sorted({r for p in PACKAGES for r in _pyproject_list(p, "requires")} - set(BUILD_REQUIREMENTS))
    if unbuilt:
        session.error(f"build requirements missing from the noxfile's BUILD_REQUIREMENTS: {unbuilt}")
    stray = sorted(str(p) for p in (ROOT / "packages").glob("*/src/byteps/__init__.py"))
    if stray:
        session.error(f"byteps must stay a namespace package; remove {stray}")


@nox.session(name="set-version", venv_backend="none")
def set_version(session: nox.Session) -> None:
    """`nox -s set-version -- 0.2.0`: write VERSION and every pyproject's version and sibling pins."""
    if len(session.posargs) != 1:
        session.error("usage: nox -s set-version -- MAJOR.MINOR.PATCH")
    version = _valid_version(session.posargs[0])
    VERSION_FILE.write_text(version + "\n")
    for package in PACKAGES:
        path = ROOT / "packages" / package / "pyproject.toml"
        text = re.sub(r'^version = "[^"]*"', f'version = "{version}"', path.read_text(), flags=re.M)
        path.write_text(re.sub(r'"(byteps-[a-z]+)~=[^";]*', rf'"\1~={version}', text))
    _check_versions(session)
    session.log(f"every byteps package is now version {version}")


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every wheel into dist/; each must hold its compiled extension and no byteps/__init__.py."""
    dist = _dist(session)
    for package in PACKAGES:
        names = zipfile.ZipFile(_wheel(dist, package)).namelist()
        module = _module_name(package)
        if package not in PURE_PYTHON and not any(n.startswith(f"byteps/{module}/_C.") and n.endswith(".so")
                                                  for n in names):
            session.error(f"{package}: wheel lacks its compiled extension byteps/{module}/_C*.so")
        if "byteps/__init__.py" in names:
            session.error(f"{package}: wheel ships byteps/__init__.py, which breaks the namespace")
        own = tuple(f"byteps/{m}/" for m in MODULES.get(package, (module,)))
        foreign = [n for n in names if not n.startswith((*own, package.replace("-", "_")))]
        if foreign:
            session.error(f"{package}: wheel holds files outside byteps/{module}: {foreign}")
        kind = "pure Python" if package in PURE_PYTHON else "extension present"
        session.log(f"{package}: {len(names)} files, {kind}, namespace clean")
    session.log(f"wheels in {dist}: pip install --find-links dist byteps-<package> (docs/install.md)")


#: Each adapter's tests/matrix/: capabilities run again in more layouts (docs/horovod-compatibility.md, "Layouts"),
#: too slow for the default run; the matrix-* sessions (`nox -t matrix`) run them.
MATRIX = "matrix"
#: Each test session ends with its slowest tests, so that a CI log says where its time goes.
SLOWEST = "--durations=10"


def _tests(session: nox.Session, package: str, *extra: str, also: tuple = (), ignore: tuple = (),
           only: str = "") -> None:
    """Install ``package`` (and the byteps packages its tests need, ``also``) with the test kit; run its tests
    (less the files in ``ignore``, which another session runs, and the matrix folder), or only the folder
    ``only`` of them."""
    _install(session, *dict.fromkeys((package, *also, TESTKIT)), extra=("pytest", *extra))
    tests = ROOT / "packages" / package / "tests"
    if only:
        session.run("python", "-m", "pytest", "-q", str(tests / only), *session.posargs)
        return
    ignore = (*ignore, MATRIX) if (tests / MATRIX).is_dir() else ignore
    session.run("python", "-m", "pytest", "-q", SLOWEST, str(tests), *(f"--ignore={tests / name}" for name in ignore),
                *session.posargs)


@nox.session(name="tests-testkit")
def tests_testkit(session: nox.Session) -> None:
    # The kit's own tests use stand-in programs: no other byteps package is installed.
    _tests(session, TESTKIT)


@nox.session(name="tests-transport")
def tests_transport(session: nox.Session) -> None:
    _tests(session, "byteps-transport", "numpy")


@nox.session(name="tests-common")
def tests_common(session: nox.Session) -> None:
    # The worker's jobs (local aggregation, fusion, priority) need a real server and scheduler.
    _tests(session, "byteps-common", "hypothesis", also=("byteps-server",))


@nox.session(name="tests-server")
def tests_server(session: nox.Session) -> None:
    _tests(session, "byteps-server", "hypothesis", "matplotlib")


@nox.session(name="tests-launcher")
def tests_launcher(session: nox.Session) -> None:
    # matplotlib: the timeline's picture; kubernetes: the API models the manifests are checked against;
    # the ssh and SLURM tests need their engines and run in tests-engines
    _tests(session, "byteps-launcher", "matplotlib", "kubernetes", "tqdm", ignore=ENGINE_TESTS)


@nox.session(name="tests-torch")
def tests_torch(session: nox.Session) -> None:
    # torch first, in a pip call of its own, so that it comes from the pinned
    # local wheel and nothing later can float it.
    session.install(TORCH)
    _tests(session, "byteps-torch", "scikit-learn")


@nox.session(name="matrix-torch", tags=[MATRIX])
def matrix_torch(session: nox.Session) -> None:
    """torch's capabilities in the layouts the default run leaves out (not in `nox`; `nox -t matrix`)."""
    session.install(TORCH)
    _tests(session, "byteps-torch", "scikit-learn", only=MATRIX)


@nox.session(name="tests-tf")
def tests_tf(session: nox.Session) -> None:
    # TensorFlow first, in a pip call of its own, as for torch: it brings
    # Keras 3 and a numpy it supports, and nothing later can float it.
    session.install(TENSORFLOW)
    session.install("--no-deps", TF_KERAS)
    _tests(session, "byteps-tf", "scikit-learn")


@nox.session(name="matrix-tf", tags=[MATRIX])
def matrix_tf(session: nox.Session) -> None:
    """TensorFlow's and Keras' capabilities in the layouts and modes the default run leaves out."""
    session.install(TENSORFLOW)
    session.install("--no-deps", TF_KERAS)
    _tests(session, "byteps-tf", "scikit-learn", only=MATRIX)


def _mxnet_tests(session: nox.Session, only: str = "") -> None:
    # One pip call: the byteps wheels, mxnet, numpy pinned and the test tools together.
    _install(session, "byteps-mxnet", TESTKIT, extra=(*MXNET, "pytest"))
    session.run("python", "-c", "import mxnet, numpy; print('mxnet', mxnet.__version__, 'numpy', numpy.__version__)")
    tests = ROOT / "packages" / "byteps-mxnet" / "tests"
    where = [str(tests / only)] if only else [str(tests)] + ([f"--ignore={tests / MATRIX}"]
                                                             if (tests / MATRIX).is_dir() else [])
    session.run("python", "-m", "pytest", "-q", SLOWEST, *where, *session.posargs)


@nox.session(name="tests-mxnet")
def tests_mxnet(session: nox.Session) -> None:
    _mxnet_tests(session)


@nox.session(name="matrix-mxnet", tags=[MATRIX])
def matrix_mxnet(session: nox.Session) -> None:
    """MXNet's capabilities in the layouts the default run leaves out."""
    _mxnet_tests(session, only=MATRIX)


#: The tests that start cluster engines for real (sshd, SLURM, Ray), run by tests-engines only.
ENGINE_TESTS = ("test_ssh_hosts.py", "test_elastic_hosts.py", "test_slurm.py", "test_ray.py")
#: Ray, from PyPI, for byteps-launcher[ray] (pinned: its API moves between releases).
RAY = "ray[train]==2.60.0"
#: Debian's packages tests-engines installs: the program that shows each is there, and the package.
ENGINE_PACKAGES = {"/usr/sbin/sshd": "openssh-server", "/usr/sbin/munged": "munge", "/usr/sbin/slurmctld": "slurmctld",
                   "/usr/sbin/slurmd": "slurmd", "/usr/bin/srun": "slurm-client"}


@nox.session(name="tests-engines")
def tests_engines(session: nox.Session) -> None:
    """Jobs started through real cluster engines: bpslaunch -H over ssh to one sshd per loopback address,
    srun/sbatch bpslaunch on a two-node SLURM cluster the tests start (munged and slurmctld here, a slurmd
    in each of two network namespaces), and RayExecutor / BytePSTrainer on a two-node Ray cluster (ray
    start) in a network namespace of the test's. Needs root (namespaces).

    Installs the engines from Debian's packages when missing (needs root and
    apt-get, as CI has), so that no engine test is skipped for want of a package.
    """
    missing = [package for program, package in ENGINE_PACKAGES.items() if not pathlib.Path(program).exists()]
    if missing:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    session.install(TORCH)
    _install(session, "byteps-torch", "byteps-server", "byteps-launcher", TESTKIT,
             extra=("pytest", "scikit-learn", RAY))
    tests = ROOT / "packages" / "byteps-launcher" / "tests"
    session.run("python", "-m", "pytest", "-q", SLOWEST, *(str(tests / name) for name in ENGINE_TESTS),
                *session.posargs, env={"BYTEPS_REQUIRE_ENGINES": "1"})


def _install_by_name(session: nox.Session, *requirements: str, byteps: set, frameworks: set = frozenset()) -> None:
    """Run README's `pip install --find-links dist REQUIREMENTS` (dist/ filled first) in this session's venv.

    Exactly the byteps packages ``byteps`` must arrive, every one from dist/
    (none from an index), and no deep-learning framework but ``frameworks``.
    """
    _dist(session)
    # With `nox -r` a reused venv keeps older byteps 0.1.0 copies "already satisfied": remove them first.
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *PACKAGES, silent=True)
    report = pathlib.Path(session.create_tmp()) / "pip-report.json"
    # "dist" as the README writes it: nox runs every session in the noxfile's folder, the repo root.
    session.install("--find-links", "dist", "--report", str(report), *requirements)
    installed = {item["metadata"]["name"].lower(): item["download_info"]["url"]
                 for item in json.loads(report.read_text())["install"]}
    arrived = {name for name in installed if name.startswith("byteps-")}
    if arrived != byteps:
        session.error(f"{' '.join(requirements)} should install {sorted(byteps)}, installed {sorted(arrived)}")
    elsewhere = [f"{name} from {installed[name]}" for name in sorted(arrived)
                 if not installed[name].startswith(DIST.as_uri() + "/")]
    if elsewhere:
        session.error(f"byteps packages not taken from dist/: {elsewhere}")
    unwanted = sorted((FRAMEWORK_DISTRIBUTIONS - frameworks) & installed.keys())
    if unwanted:
        session.error(f"{' '.join(requirements)} installed or replaced a framework: {unwanted}")
    session.log(f"installed from dist/: {', '.join(sorted(arrived))}")


@nox.session(name="install-server")
def install_server(session: nox.Session) -> None:
    """README's server box: `pip install --find-links dist byteps-server` brings no framework, and a real job runs."""
    _install_by_name(session, "byteps-server", byteps={"byteps-common", "byteps-server", "byteps-transport"})
    session.run("python", "-c", (
        "import importlib.util, sys; "
        f"present = [m for m in {FRAMEWORK_MODULES!r} if importlib.util.find_spec(m)]; "
        "sys.exit(f'frameworks installed with byteps-server: {present}' if present else 0)"))
    session.run("byteps-server", "--help", silent=True)
    # Only now the test kit (it runs the job and holds its worker), after the checks above
    # have seen what byteps-server alone brings.
    session.install("--find-links", "dist", TESTKIT, "pytest")
    session.run("python", "-m", "pytest", "-q", str(ROOT / "packages" / "byteps-server" / "tests" / "test_job.py"),
                "-k", "matches_numpy and 2-1")


@nox.session(name="install-torch")
def install_torch(session: nox.Session) -> None:
    """README's torch adapter alone: the user's torch, then `pip install --find-links dist byteps-torch`; a job runs."""
    session.install(TORCH)
    _install_by_name(session, "byteps-torch", byteps={"byteps-common", "byteps-launcher", "byteps-server",
                                                      "byteps-torch", "byteps-transport"})
    script = "examples/torch/hello_allreduce.py"
    output = session.run("bpslaunch", "-np", "2", "--", "python", script, silent=True)
    session.log(output.strip())
    for rank in range(2):
        if f"rank {rank} of 2: mean 1.5, expected 1.5" not in output:
            session.error(f"rank {rank} did not report the average 1.5 of ranks' values 1 and 2")


@nox.session(name="install-tf")
def install_tf(session: nox.Session) -> None:
    """The TensorFlow adapter alone, as install-torch (not in the default run: TensorFlow is 1.6 GB)."""
    session.install(TENSORFLOW)
    _install_by_name(session, "byteps-tf", byteps={"byteps-common", "byteps-launcher", "byteps-server",
                                                   "byteps-tf", "byteps-transport"})
    session.run("python", "-c", "import byteps.tensorflow, byteps.keras; print('byteps.tensorflow imports')")


@nox.session(name="install-mxnet")
def install_mxnet(session: nox.Session) -> None:
    """The MXNet adapter alone, in one pip call with mxnet and its numpy pin (not in the default run)."""
    _install_by_name(session, *MXNET[:2], "byteps-mxnet", frameworks={"mxnet"},
                     byteps={"byteps-common", "byteps-launcher", "byteps-server", "byteps-mxnet", "byteps-transport"})
    session.run("python", "-c", "import byteps.mxnet, numpy; print('byteps.mxnet imports, numpy', numpy.__version__)")


@nox.session(reuse_venv=True)
def demo(session: nox.Session) -> None:
    """The main job on this machine: a PyTorch CNN trained by 2 workers through 1 server.

    Builds only the five wheels it needs; its venv is kept, so a second run
    with no source change installs nothing and starts the job at once.
    """
    _install(session, "byteps-torch", extra=(TORCH, "scikit-learn", "tqdm"))
    session.run("bpslaunch", "--workers", "2", "--servers", "1", "--",
                "python", str(ROOT / "examples" / "torch" / "train_digits.py"), *session.posargs)


@nox.session(name="demo-numpy", reuse_venv=True)
def demo_numpy(session: nox.Session) -> None:
    """The same job without any framework: a numpy MLP over byteps-common's API."""
    _install(session, "byteps-launcher", extra=("scikit-learn",))
    session.run("bpslaunch", "--workers", "2", "--servers", "1", "--",
                "python", str(ROOT / "examples" / "numpy" / "train_digits.py"), *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks whose figures go into docs/performance.md and its notebook (not part of the default run)."""
    session.install(TORCH)
    _install(session, "byteps-torch")
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        session.run("python", str(script))
    synthetic = str(ROOT / "examples" / "torch" / "synthetic_benchmark.py")
    session.run("python", synthetic)
    for layout in (["-np", "2"], ["--workers", "2", "--servers", "2"]):
        session.run("bpslaunch", *layout, "--", "python", synthetic)


@nox.session(name="bench-cluster")
def bench_cluster(session: nox.Session) -> None:
    """The cluster benchmark (as root): byteps vs gloo vs MXNet on simulated hosts with capped NICs.

    Not in the default run (about an hour). Writes docs/performance-notebook.md's
    cluster section and docs/img/cluster_benchmark.{png,json}; arguments after
    `--` go to benchmarks/cluster/run_cluster_bench.py (e.g. `-- --workers 4`).
    MXNet 1.9.1 runs in a venv of its own that the rig creates (.nox/_cluster_mxnet).
    """
    session.install(TORCH)
    _install(session, "byteps-torch", "byteps-server", extra=("matplotlib",))
    session.run("python", str(ROOT / "benchmarks" / "cluster" / "run_cluster_bench.py"), *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Long runs, not in the default run (about 10 minutes).

    2,000 rounds of a 200-tensor model (memory and descriptors must stay
    flat), and a role-mode server and scheduler started 5 minutes before
    their workers (they must wait and serve the job).
    """
    _install(session, "byteps-server", "byteps-launcher", TESTKIT, extra=("pytest",))
    soak = ROOT / "packages" / "byteps-server" / "tests" / "test_soak.py"
    late = ROOT / "packages" / "byteps-launcher" / "tests" / "test_job_shows_itself.py"
    session.run("python", "-m", "pytest", "-q", "-s", str(soak), env={"BYTEPS_SOAK": "1"})
    session.run("python", "-m", "pytest", "-q", str(late), "-k", "late_workers", env={"BYTEPS_SOAK": "1"})
