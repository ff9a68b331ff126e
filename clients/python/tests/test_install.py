"""`pip install ./clients/python` into a fresh venv, with no package index
at all (--no-index): the build backend is the interpreter's own setuptools
(Debian's python3-setuptools and python3-wheel), so nothing is downloaded.
The installed package then takes a lease from a real fenced, imported from
outside the checkout."""

import os
import subprocess
import sys
import tempfile
import unittest

from support import PKG, Fenced


class TestInstall(unittest.TestCase):
    def test_pip_install_downloads_nothing_and_the_package_works(self):
        with tempfile.TemporaryDirectory(prefix="fence-py-venv-") as tmp:
            venv = os.path.join(tmp, "venv")
            # --system-site-packages: Debian's cryptography, psycopg2 and redis.
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, timeout=120)
            py = os.path.join(venv, "bin", "python")
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
            r = subprocess.run(
                [py, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", PKG],
                capture_output=True, text=True, timeout=300, env=env, cwd=tmp,
            )
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("Successfully installed fence-client-0.1.0", r.stdout)

            fenced = Fenced().start()
            self.addCleanup(fenced.stop)
            code = (
                "import sys, fence\n"
                "assert fence.__file__.startswith(sys.prefix), fence.__file__\n"
                "with fence.Client(sys.argv[1]) as c, c.acquire('py/installed', ttl=5) as lease:\n"
                "    fence.RemoteKeySet(sys.argv[1]).verify(fence.parse_token(lease.token_text))\n"
                "    print(fence.__version__, lease.token > 0)\n"
            )
            r = subprocess.run([py, "-c", code, fenced.url], capture_output=True, text=True, timeout=60, env=env, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, "0.1.0 True\n")


if __name__ == "__main__":
    unittest.main()
