#!/usr/bin/env bash
# PyGObject for the GPU machine (Ubuntu 24.04, Python 3.12, no GLib development files, no network),
# so that the Python jobs (gst_latent.precompute, bench/bench_precompute.py) can run there.
# Here (Debian 12): downloads Debian's GLib / gobject-introspection development packages and the
# PyGObject sdist from PyPI into .carry/pygi (~9 MB); there: `bash scripts/device/pygi-build.sh`
# builds it against them (about 40 s) and writes /tmp/pygi/env.sh. Carry .carry/pygi.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.carry/pygi
mkdir -p "$D"
(cd "$D" && apt-get download -q \
  libgirepository1.0-dev libgirepository-1.0-1 gir1.2-glib-2.0 gir1.2-gstreamer-1.0 \
  gir1.2-gst-plugins-base-1.0 libglib2.0-dev libglib2.0-dev-bin libglib2.0-0 libffi-dev libffi8 \
  libpcre2-dev libpcre2-8-0 libsepol-dev libselinux1-dev libselinux1 libmount-dev libmount1 \
  libblkid-dev libblkid1 zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3)
# The sdist (pip download would try to build it): from PyPI's simple index.
python3 - "$D" <<'PY'
import re, sys, urllib.request
html = urllib.request.urlopen("https://pypi.org/simple/pygobject/").read().decode()
url = re.findall(r'href="([^"]+pygobject-3\.48\.2\.tar\.gz)[^"]*"', html)[0]
urllib.request.urlretrieve(url, sys.argv[1] + "/pygobject-3.48.2.tar.gz")
PY
du -sh "$D"
