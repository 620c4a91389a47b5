"""Makes the tests runnable from the source tree: the tests folder on sys.path (reference,
worker) and, when PYTHONPATH does not already provide ubep, the usual build folders."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import ubep  # noqa: F401
except ImportError:
    root = os.path.dirname(os.path.dirname(HERE))
    for build in (os.environ.get("UBEP_BUILD_DIR", ""), "build", "build-py"):
        path = os.path.join(root, build, "python") if build else ""
        if path and os.path.isdir(os.path.join(path, "ubep")):
            sys.path.insert(0, path)
            break
