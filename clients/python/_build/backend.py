"""The build backend: setuptools' own (setuptools.build_meta), taken from
the interpreter that runs pip, so that `pip install ./clients/python`
downloads nothing.

pyproject.toml asks pip for no build requirements, so pip's isolated build
environment has nothing installed, and pip needs no package index to make
it. This module then imports the setuptools the interpreter already has:
Debian's python3-setuptools for /usr/bin/python3, or the one a venv comes
with. pip's isolation hides the interpreter's site-packages from the build;
they are added back here, after pip's own paths.
"""

import site
import sys

try:
    from setuptools import build_meta as _meta
except ImportError:
    for _dir in site.getsitepackages() + [site.getusersitepackages()]:
        if _dir not in sys.path:
            sys.path.append(_dir)
    try:
        from setuptools import build_meta as _meta
    except ImportError as err:
        raise ImportError(
            "building fence-client needs setuptools 61 or later in the Python that runs pip: "
            "apt-get install python3-setuptools (Debian, Ubuntu), or pip install setuptools"
        ) from err



def _missing(requires):
    """_missing keeps the build requirements setuptools names (wheel, for
    setuptools before 70.1) that this interpreter cannot import, so that pip
    fetches only what is really missing: nothing, with Debian's
    python3-setuptools and python3-wheel."""
    out = []
    for req in requires:
        name = req.split(";")[0].split("[")[0]
        for op in "<>=!~ ":
            name = name.split(op)[0]
        try:
            __import__(name.strip().replace("-", "_"))
        except ImportError:
            out.append(req)
    return out


def get_requires_for_build_wheel(config_settings=None):
    return _missing(_meta.get_requires_for_build_wheel(config_settings))


def get_requires_for_build_sdist(config_settings=None):
    return _missing(_meta.get_requires_for_build_sdist(config_settings))


build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
if hasattr(_meta, "build_editable"):
    build_editable = _meta.build_editable
    prepare_metadata_for_build_editable = _meta.prepare_metadata_for_build_editable

    def get_requires_for_build_editable(config_settings=None):
        return _missing(_meta.get_requires_for_build_editable(config_settings))
