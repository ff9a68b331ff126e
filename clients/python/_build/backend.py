"""The build backend of fence-client (PEP 517, and PEP 660 for editable
installs), in the standard library only, so that `pip install
./clients/python` needs nothing pip would have to fetch: pyproject.toml
asks for no build requirements, and this module, found through
backend-path, builds the wheel and the sdist itself with zipfile and
tarfile. Any Python 3.9 or later in a plain venv installs the package
offline, whatever setuptools and wheel it has or lacks (setuptools before
70.1 asks pip for `wheel`, which an offline pip cannot find).

The package is pure Python: the wheel holds src/fence and the metadata
pyproject.toml's [project] table gives (Core Metadata 2.1), tagged
py3-none-any. The sdist holds what builds the wheel again.
"""

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "fence"  # the import name, under src/
WHEEL_TAG = "py3-none-any"
SDIST_FILES = ("pyproject.toml", "README.md", "_build/backend.py")


# --- pyproject.toml ---------------------------------------------------------

def _read_pyproject():
    """_read_pyproject returns pyproject.toml as a dict: with tomllib where
    the Python has it (3.11 on), otherwise with _parse_toml, which reads
    the small part of TOML the file uses (a test checks they agree)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        data = f.read()
    try:
        import tomllib
    except ImportError:
        return _parse_toml(data.decode("utf-8"))
    return tomllib.loads(data.decode("utf-8"))


_KEY = r"[A-Za-z0-9_-]+"
_STRING = r'"(?:[^"\\]|\\.)*"'


def _parse_toml(text):
    """_parse_toml reads the subset of TOML that pyproject.toml is written
    in: [table] and [a.b] headers, and key = value lines whose value is a
    basic string, an array of basic strings on one line, or an inline
    table of key = basic string. Anything else is an error naming the
    line, rather than a guess."""
    out = {}
    table = out
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(%s(?:\.%s)*)\]" % (_KEY, _KEY), line)
        if m:
            table = out
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.fullmatch(r"(%s)\s*=\s*(.+?)\s*(?:#[^\"]*)?" % _KEY, line)
        if not m:
            raise ValueError("pyproject.toml line %d: %r is not key = value (the build backend reads "
                             "only strings, one-line arrays of strings and inline tables of strings)" % (n, raw))
        table[m.group(1)] = _toml_value(m.group(2), n)
    return out


def _toml_value(s, n):
    if re.fullmatch(_STRING, s):
        return _toml_string(s)
    if re.fullmatch(r"\[\s*(?:%s\s*(?:,\s*%s\s*)*,?)?\s*\]" % (_STRING, _STRING), s):
        return [_toml_string(x) for x in re.findall(_STRING, s)]
    pair = r"(%s)\s*=\s*(%s)" % (_KEY, _STRING)
    if re.fullmatch(r"\{\s*(?:%s\s*(?:,\s*%s\s*)*)?\}" % (pair, pair), s):
        return {k: _toml_string(v) for k, v in re.findall(pair, s)}
    raise ValueError("pyproject.toml line %d: value %s is not a string, a one-line array of strings "
                     "or an inline table of strings, all the build backend reads" % (n, s))


def _toml_string(s):
    esc = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}

    def sub(m):
        c = m.group(1)
        if c in esc:
            return esc[c]
        return chr(int(c[1:], 16))

    return re.sub(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", sub, s[1:-1])


# --- the project ------------------------------------------------------------

class _Project:
    def __init__(self):
        p = _read_pyproject()["project"]
        self.name = p["name"]
        self.version = p["version"]
        # PEP 427 and PEP 625: file names use the normalized name.
        self.dist = re.sub(r"[-_.]+", "_", self.name).lower()
        self.base = "%s-%s" % (self.dist, self.version)
        self.info = self.base + ".dist-info"
        self.p = p

    def metadata(self):
        p = self.p
        lines = ["Metadata-Version: 2.1", "Name: " + self.name, "Version: " + self.version]
        if p.get("description"):
            lines.append("Summary: " + p["description"])
        if p.get("requires-python"):
            lines.append("Requires-Python: " + p["requires-python"])
        lic = p.get("license")
        if isinstance(lic, dict) and lic.get("text"):
            lines.append("License: " + lic["text"])
        for dep in p.get("dependencies", []):
            lines.append("Requires-Dist: " + dep)
        for extra, deps in sorted(p.get("optional-dependencies", {}).items()):
            lines.append("Provides-Extra: " + extra)
            for dep in deps:
                lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
        body = ""
        if p.get("readme"):
            lines.append("Description-Content-Type: text/markdown")
            with open(os.path.join(ROOT, p["readme"]), encoding="utf-8") as f:
                body = "\n" + f.read()
        return ("\n".join(lines) + "\n" + body).encode("utf-8")

    def wheel_file(self):
        return ("Wheel-Version: 1.0\nGenerator: fence-client _build/backend.py\n"
                "Root-Is-Purelib: true\nTag: %s\n" % WHEEL_TAG).encode("utf-8")

    def package_files(self):
        """package_files yields (path in the wheel, path on disk) for every
        file of src/fence, in a fixed order, leaving out caches."""
        src = os.path.join(ROOT, "src")
        for dirpath, dirnames, filenames in os.walk(os.path.join(src, PACKAGE)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, src).replace(os.sep, "/"), path


# Reproducible archives: every entry gets one time, SOURCE_DATE_EPOCH's if
# set (zip cannot hold times before 1980).
def _epoch():
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)


def _write_wheel(directory, proj, files):
    """_write_wheel writes a wheel of files ((name, bytes) pairs) and the
    dist-info of proj, with its RECORD, and returns its file name."""
    name = "%s-%s.whl" % (proj.base, WHEEL_TAG)
    files = list(files) + [
        (proj.info + "/METADATA", proj.metadata()),
        (proj.info + "/WHEEL", proj.wheel_file()),
        (proj.info + "/top_level.txt", (PACKAGE + "\n").encode("utf-8")),
    ]
    record = []
    stamp = time.gmtime(_epoch())[:6]
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
            zi = zipfile.ZipInfo(arc, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
        record.append(proj.info + "/RECORD,,")
        zi = zipfile.ZipInfo(proj.info + "/RECORD", stamp)
        zi.external_attr = 0o644 << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(zi, ("\n".join(record) + "\n").encode("utf-8"))
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# --- the PEP 517 and PEP 660 hooks -------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    proj = _Project()
    info = os.path.join(metadata_directory, proj.info)
    os.makedirs(info, exist_ok=True)
    for name, data in (("METADATA", proj.metadata()), ("WHEEL", proj.wheel_file())):
        with open(os.path.join(info, name), "wb") as f:
            f.write(data)
    return proj.info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    proj = _Project()
    return _write_wheel(wheel_directory, proj, ((arc, _read(path)) for arc, path in proj.package_files()))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """build_editable's wheel holds only a .pth file naming src/, so that
    the installed package is the checkout's own files."""
    proj = _Project()
    pth = (os.path.join(ROOT, "src") + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, proj, [("__editable__.%s.pth" % proj.base, pth)])


def build_sdist(sdist_directory, config_settings=None):
    proj = _Project()
    name = proj.base + ".tar.gz"
    files = [(p, os.path.join(ROOT, p)) for p in SDIST_FILES]
    files += [("src/" + arc, path) for arc, path in proj.package_files()]
    files.append(("PKG-INFO", None))

    def add(tar, arc, data):
        ti = tarfile.TarInfo("%s/%s" % (proj.base, arc))
        ti.size, ti.mtime, ti.mode = len(data), _epoch(), 0o644
        ti.uname = ti.gname = ""
        tar.addfile(ti, io.BytesIO(data))

    # gzip's own header carries a time too: fixed, as the entries' are.
    with open(os.path.join(sdist_directory, name), "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_epoch()) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for arc, path in files:
                    add(tar, arc, proj.metadata() if path is None else _read(path))
    return name
