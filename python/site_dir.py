"""Prints where `cmake --install` puts the ubep package for this interpreter and a prefix.

The directory of sys.path under the prefix (Debian: /usr/local/lib/python3.11/dist-packages for
/usr/local, /usr/lib/python3/dist-packages for /usr), else the scheme's platlib for the prefix
(then add it to PYTHONPATH).
"""
import os
import sys
import sysconfig

prefix = os.path.abspath(sys.argv[1])
for path in sys.path:
    if path.startswith(prefix + os.sep) and path.endswith(("site-packages", "dist-packages")):
        print(path)
        break
else:
    print(sysconfig.get_path("platlib", "posix_prefix", {"base": prefix, "platbase": prefix}))
