#!/usr/bin/env bash
# On the GPU machine: builds PyGObject 3.48.2 for its python3 from .carry/pygi (see
# pygi-carry.sh) and writes /tmp/pygi/env.sh (PYTHONPATH, GI_TYPELIB_PATH, LD_LIBRARY_PATH);
# GLib and GStreamer themselves come from the carried GStreamer runtime (.gstrt).
set -euo pipefail
C=$(cd "$(dirname "$0")/../.." && pwd)/.carry/pygi; P=/tmp/pygi; R=$P/root
rm -rf $P; mkdir -p $R
for f in $C/*.deb; do dpkg -x $f $R; done
L=$R/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L:$R/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# The .pc files say /usr: point them at the unpacked root (not PKG_CONFIG_SYSROOT_DIR, which would
# also rewrite the python3-embed.pc meson finds through Python's own LIBPC).
for pc in $L/pkgconfig/*.pc $R/usr/share/pkgconfig/*.pc; do [ -f "$pc" ] && sed -i "s|=/usr|=$R/usr|" "$pc"; done
export C_INCLUDE_PATH=$R/usr/include/x86_64-linux-gnu LIBRARY_PATH=$L
export PKG_CONFIG="$R/usr/bin/pkgconf" PKG_CONFIG_PATH=$L/pkgconfig:$R/usr/share/pkgconfig
tar xzf $C/pygobject-3.48.2.tar.gz -C $P
cd $P/pygobject-3.48.2
meson setup b --wrap-mode=nodownload -Dpycairo=disabled -Dtests=false --prefix=$P/inst -Dpython=python3 > $P/meson.log 2>&1 || { tail -30 $P/meson.log; exit 1; }
ninja -C b > $P/ninja.log 2>&1 || { tail -30 $P/ninja.log; exit 1; }
meson install -C b > $P/install.log 2>&1 || { tail -20 $P/install.log; exit 1; }
SP=$(dirname "$(find $P/inst -name __init__.py -path '*gi/__init__.py' | head -1)")
echo "export PYTHONPATH=$(dirname $SP)\${PYTHONPATH:+:\$PYTHONPATH} GI_TYPELIB_PATH=$L/girepository-1.0 LD_LIBRARY_PATH=$L:\$LD_LIBRARY_PATH" > $P/env.sh
cat $P/env.sh
