"""`pip install ./clients/python` into a fresh venv, with no package index
at all (--no-index): the build backend (_build/backend.py) is in the
standard library only, so nothing is downloaded, whatever setuptools and
wheel the interpreter has. It runs with the machine's default `python3`
(the first on PATH: pyenv's, a venv's, or Debian's) in a plain venv, and
with the interpreter running the tests in a venv that sees its
site-packages (Debian's cryptography). The installed package then takes a
lease from a real fenced, imported from outside the checkout."""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

from support import PKG, Fenced

sys.path.insert(0, os.path.join(PKG, "_build"))
import backend  # noqa: E402  (the build backend itself, for its TOML reader)

# The lease, from a venv: the package must come from the venv, not the
# checkout; with verify, its token's signature is checked too.
_USE = (
    "import sys, fence\n"
    "assert fence.__file__.startswith(sys.prefix), fence.__file__\n"
    "with fence.Client(sys.argv[1]) as c, c.acquire('py/installed', ttl=5) as lease:\n"
    "    if sys.argv[2] == 'verify':\n"
    "        fence.RemoteKeySet(sys.argv[1]).verify(fence.parse_token(lease.token_text))\n"
    "    print(fence.__version__, lease.token > 0)\n"
)


class TestInstall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fenced = Fenced().start()

    @classmethod
    def tearDownClass(cls):
        cls.fenced.stop()

    def install(self, python, *venv_flags):
        """install makes a venv with python, pip installs the package into
        it with --no-index, and returns the venv's interpreter."""
        tmp = tempfile.mkdtemp(prefix="fence-py-venv-")
        self.addCleanup(shutil.rmtree, tmp, True)
        venv = os.path.join(tmp, "venv")
        env = self.env()
        r = subprocess.run([python, "-m", "venv", *venv_flags, venv], capture_output=True, text=True,
                           timeout=180, env=env, cwd=tmp)
        self.assertEqual(r.returncode, 0, f"{python} -m venv: {r.stdout}{r.stderr}")
        py = os.path.join(venv, "bin", "python")
        r = subprocess.run(
            [py, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", PKG],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp,
        )
        self.assertEqual(r.returncode, 0, f"pip install --no-index with {python}:\n{r.stdout}{r.stderr}")
        self.assertIn("Successfully installed fence-client-0.1.0", r.stdout)
        return py, tmp

    def env(self):
        # No PYTHONPATH (it would find the checkout's src) and no pip
        # configuration that could point pip at packages.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        return env

    def use(self, py, cwd, mode):
        r = subprocess.run([py, "-c", _USE, self.fenced.url, mode], capture_output=True, text=True,
                           timeout=60, env=self.env(), cwd=cwd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "0.1.0 True\n")

    def test_default_python3_plain_venv(self):
        python = shutil.which("python3")
        self.assertIsNotNone(python, "no python3 on PATH")
        py, tmp = self.install(python)
        self.use(py, tmp, "lease")

    def test_this_python_with_its_site_packages(self):
        # --system-site-packages: Debian's cryptography, psycopg2 and redis.
        py, tmp = self.install(sys.executable, "--system-site-packages")
        self.use(py, tmp, "verify" if have_cryptography(py) else "lease")


def have_cryptography(py):
    return subprocess.run([py, "-c", "import cryptography"], capture_output=True, timeout=60).returncode == 0


class TestBackend(unittest.TestCase):
    def test_toml_reader_agrees_with_tomllib(self):
        try:
            import tomllib
        except ImportError:
            self.skipTest("tomllib is Python 3.11 and later")
        with open(os.path.join(PKG, "pyproject.toml"), "rb") as f:
            data = f.read().decode("utf-8")
        self.assertEqual(backend._parse_toml(data), tomllib.loads(data))

    def test_toml_reader_refuses_what_it_does_not_read(self):
        for text in ('[project]\nversion = 1\n', '[project]\nx = """a\nb"""\n', 'a.b = "c"\n'):
            with self.assertRaisesRegex(ValueError, "line [12]: .*build backend"):
                backend._parse_toml(text)

    def test_sdist_holds_what_builds_the_wheel_again(self):
        with tempfile.TemporaryDirectory() as out:
            name = backend.build_sdist(out)
            self.assertEqual(name, "fence_client-0.1.0.tar.gz")
            with tarfile.open(os.path.join(out, name)) as tar:
                names = set(tar.getnames())
            for want in ("pyproject.toml", "README.md", "_build/backend.py", "PKG-INFO", "src/fence/__init__.py"):
                self.assertIn("fence_client-0.1.0/" + want, names)


if __name__ == "__main__":
    unittest.main()
