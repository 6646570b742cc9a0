#!/usr/bin/env python3
"""Builds the training set and the held-out test photographs of the built-in default autoencoder.

Every image comes from a package the project can install: Debian 12 wallpaper packages
(fetched with `apt-get download`, unpacked with `dpkg-deb -x`, nothing is installed) and the
sample images bundled in the scikit-image wheel. SOURCES below lists each file with its author
and licence, as given by the package's debian/copyright (and, for Plasma, metadata.json).

Roles:
  train   photographs the model is trained on
  render  openly licensed non-photographic wallpapers (gradients, flat artwork), a minority of
          the training batches so that flat colours and hard edges are not foreign to the model
  test    held-out photographs: never trained on; written as 512x512 PNG fixtures for the
          quality test (tests/fixtures/photos) and for evaluate.py

Output (--out, default .carry/default_data, ignored by git):
  train/<id>.jpg   training images, long side at most --max-side, JPEG q95 4:4:4
  eval/<id>.png    the held-out photos at 512x512 (same pixels as the fixtures)
  manifest.json    every source: package, version, path, sha256, author, licence, role

Usage (needs Pillow and scikit-image, e.g. /opt/refenv/bin/python):
  python3 scripts/default_model/prepare_data.py [--out .carry/default_data]
      [--fixtures tests/fixtures/photos] [--debs /tmp/latent-default-debs] [--max-side 1536]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

from PIL import Image

Image.MAX_IMAGE_PIXELS = None

LOMIRI = "/usr/share/backgrounds/"
MATE = "/usr/share/backgrounds/mate/"
PLASMA = "/usr/share/wallpapers/"
UKUI = "/usr/share/backgrounds/"

# (id, source, path, author, licence, role). source: a Debian package or "scikit-image".
SOURCES = [
    # lomiri-wallpapers-16.04: photographs of the Ubuntu Touch 16.04 wallpaper contest.
    ("bridge", "lomiri-wallpapers-16.04", LOMIRI + "Bridge_by_Sander_Klootwijk.jpg", "Sander Klootwijk", "CC-BY-SA-4.0", "train"),
    ("dragonfly", "lomiri-wallpapers-16.04", LOMIRI + "Dragonfly_by_Bolly.jpg", "\"Bolly\"", "CC-BY-SA-4.0", "train"),
    ("brushes", "lomiri-wallpapers-16.04", LOMIRI + "Picture_1A_by_freespace.jpg", "Trevor \"Freespace\"", "CC-BY-4.0", "train"),
    ("wine", "lomiri-wallpapers-16.04", LOMIRI + "Wine_by_Jakkub_Mede.jpg", "Jakub Mede", "CC-BY-4.0", "train"),
    ("aitzgorri", "lomiri-wallpapers-16.04", LOMIRI + "aitzgorri_by_Aitzol_Berasategi.jpg", "Aitzol Berasategi", "CC-BY-4.0", "train"),
    ("analogpattern", "lomiri-wallpapers-16.04", LOMIRI + "analogpattern_by_Peter_Nerlich.jpg", "Peter Nerlich", "CC-BY-SA-4.0", "train"),
    ("free", "lomiri-wallpapers-16.04", LOMIRI + "free_by_Peter_Nerlich.jpg", "Peter Nerlich", "CC-BY-SA-4.0", "train"),
    ("friends", "lomiri-wallpapers-16.04", LOMIRI + "friends_by_Aitzol_Berasategi.jpg", "Aitzol Berasategi", "CC-BY-4.0", "train"),
    ("greentock", "lomiri-wallpapers-16.04", LOMIRI + "greentock_by_Peter_Nerlich.jpg", "Peter Nerlich", "CC-BY-SA-4.0", "train"),
    ("life", "lomiri-wallpapers-16.04", LOMIRI + "life_by_Aitzol_Berasategi.jpg", "Aitzol Berasategi", "CC-BY-4.0", "train"),
    ("seeding", "lomiri-wallpapers-16.04", LOMIRI + "seeding_by_Clements_Engelhardt.jpg", "Clemens Engelhardt", "CC0-1.0", "train"),
    ("sunset", "lomiri-wallpapers-16.04", LOMIRI + "sunset_by_Aitzol_Berasategi.jpg", "Aitzol Berasategi", "CC-BY-4.0", "train"),
    ("picosdeeuropa", "lomiri-wallpapers-16.04", LOMIRI + "picosdeeuropa_by_Aitzol_Berasategi.jpg", "Aitzol Berasategi", "CC-BY-4.0", "test"),
    ("fig", "lomiri-wallpapers-16.04", LOMIRI + "Picture_0B_by_freespace.jpg", "Trevor \"Freespace\"", "CC-BY-4.0", "test"),
    ("umang", "lomiri-wallpapers-16.04", LOMIRI + "umang_by_Abhishek_Mudgal.jpg", "Abhishek Mudgal", "CC-BY-4.0", "render"),
    # lomiri-wallpapers-20.04
    ("kleiber", "lomiri-wallpapers-20.04", LOMIRI + "Kleiber_by_Lukas_Baubkus.jpg", "Lukas Baubkus", "CC-BY-SA-3.0", "train"),
    ("fossa", "lomiri-wallpapers-20.04", LOMIRI + "Fossa_by_Jasper_Roks.jpg", "Jasper Roks", "CC-BY-SA-3.0", "render"),
    ("infinitesea", "lomiri-wallpapers-20.04", LOMIRI + "Infinite-Sea_by_Aury88.jpg", "Aury88", "CC-BY-SA-3.0", "render"),
    ("paintingcolors", "lomiri-wallpapers-20.04", LOMIRI + "Painting-Colors_by__herobrine7gamer.jpg", "HEROBRINE7GAMER", "CC-BY-SA-3.0", "render"),
    # mate-backgrounds: nature photographs (GPL-2+ per debian/copyright).
    ("aqua", "mate-backgrounds", MATE + "nature/Aqua.jpg", "Charles Barbin", "GPL-2+", "train"),
    ("blinds", "mate-backgrounds", MATE + "nature/Blinds.jpg", "Lennart Poettering, Andrea Cimitan", "GPL-2+", "train"),
    ("dune", "mate-backgrounds", MATE + "nature/Dune.jpg", "Marco Cogoni, Hylke Bons", "GPL-2+", "train"),
    ("freshflower", "mate-backgrounds", MATE + "nature/FreshFlower.jpg", "Jens Ansorg", "GPL-2+", "train"),
    ("garden", "mate-backgrounds", MATE + "nature/Garden.jpg", "Charles Barbin", "GPL-2+", "train"),
    ("greenmeadow", "mate-backgrounds", MATE + "nature/GreenMeadow.jpg", "Timothy Schellhase, Lapo Calamandrei", "GPL-2+", "train"),
    ("raindrops", "mate-backgrounds", MATE + "nature/RainDrops.jpg", "\"blackcombwhistler07\"", "GPL-2+", "train"),
    ("storm", "mate-backgrounds", MATE + "nature/Storm.jpg", "Sergey Nazarov", "GPL-2+", "train"),
    ("twowings", "mate-backgrounds", MATE + "nature/TwoWings.jpg", "Charles Barbin, Hylke Bons", "GPL-2+", "train"),
    ("wood", "mate-backgrounds", MATE + "nature/Wood.jpg", "Jean-François Fortin Tam", "GPL-2+", "train"),
    ("yellowflower", "mate-backgrounds", MATE + "nature/YellowFlower.jpg", "Charles Barbin", "GPL-2+", "train"),
    ("ladybird", "mate-backgrounds", MATE + "nature/LadyBird.jpg", "Charles Barbin", "GPL-2+", "test"),
    ("elephants", "mate-backgrounds", MATE + "abstract/Elephants.jpg", "Wyng Stancikaite", "GPL-2+", "render"),
    ("silk", "mate-backgrounds", MATE + "abstract/Silk.png", "Patryk Zawadzki", "GPL-2+", "render"),
    ("flow", "mate-backgrounds", MATE + "abstract/Flow.png", "Daniel Galleguillos, Hylke Bons", "GPL-2+", "render"),
    # plasma-workspace-wallpapers: debian/copyright says GPL-2+ for the package; each
    # wallpaper's metadata.json names its author and LGPL-3 or CC-BY-SA-4.0.
    ("bythewater", "plasma-workspace-wallpapers", PLASMA + "BytheWater/contents/images/2560x1600.jpg", "Maciej Wiklo", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("coldripple", "plasma-workspace-wallpapers", PLASMA + "ColdRipple/contents/images/2560x1600.jpg", "Risto Saukonpää", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("colorfulcups", "plasma-workspace-wallpapers", PLASMA + "ColorfulCups/contents/images/2560x1600.jpg", "Dmitri Popov", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("darkesthour", "plasma-workspace-wallpapers", PLASMA + "DarkestHour/contents/images/2560x1600.jpg", "Risto Saukonpää", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("fallenleaf", "plasma-workspace-wallpapers", PLASMA + "FallenLeaf/contents/images/2560x1600.jpg", "Martin Klapetek", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("grey", "plasma-workspace-wallpapers", PLASMA + "Grey/contents/images/2560x1600.jpg", "Sigi Sagi", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("kite", "plasma-workspace-wallpapers", PLASMA + "Kite/contents/images/2560x1600.jpg", "Risto Saukonpää", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("onestandsout", "plasma-workspace-wallpapers", PLASMA + "OneStandsOut/contents/images/2560x1600.jpg", "Risto Saukonpää", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("path", "plasma-workspace-wallpapers", PLASMA + "Path/contents/images/2560x1600.jpg", "Risto Saukonpää", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("summer1am", "plasma-workspace-wallpapers", PLASMA + "summer_1am/contents/images/2560x1600.jpg", "Risto Saukonpää", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "train"),
    ("eveningglow", "plasma-workspace-wallpapers", PLASMA + "EveningGlow/contents/images/2560x1600.jpg", "Ian Hex", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "test"),
    ("autumn", "plasma-workspace-wallpapers", PLASMA + "Autumn/contents/images/2560x1600.jpg", "RJ Quiralta", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("elarun", "plasma-workspace-wallpapers", PLASMA + "Elarun/contents/images/2560x1600.png", "Nuno Pinheiro", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("flyingkonqui", "plasma-workspace-wallpapers", PLASMA + "FlyingKonqui/contents/images/2560x1600.png", "Timothée Giet", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("pastelhills", "plasma-workspace-wallpapers", PLASMA + "PastelHills/contents/images/3200x2000.jpg", "Lionel", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("safelanding", "plasma-workspace-wallpapers", PLASMA + "SafeLanding/contents/images/5120x2880.jpg", "KDE Visual Design Group", "GPL-2+ (debian/copyright)", "render"),
    ("altai", "plasma-workspace-wallpapers", PLASMA + "Altai/contents/images/5120x2880.png", "Alesya Khoteeva", "CC-BY-SA-4.0 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("volna", "plasma-workspace-wallpapers", PLASMA + "Volna/contents/images/5120x2880.jpg", "Nikita Babin", "CC-BY-SA-4.0 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("milkyway", "plasma-workspace-wallpapers", PLASMA + "MilkyWay/contents/images/5120x2880.png", "ruvkr", "CC-BY-SA-4.0 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    ("opal", "plasma-workspace-wallpapers", PLASMA + "Opal/contents/images/3840x2160.png", "Ken Vermette", "LGPL-3 (metadata.json); GPL-2+ (debian/copyright)", "render"),
    # ukui-wallpapers: Ubuntu Kylin artwork, CC-BY-SA-3.0.
    ("ukui-calla", "ukui-wallpapers", UKUI + "calla.png", "Ubuntu Kylin community contributors", "CC-BY-SA-3.0", "render"),
    ("ukui-rhythm", "ukui-wallpapers", UKUI + "rhythm.jpg", "Ubuntu Kylin community contributors", "CC-BY-SA-3.0", "render"),
    ("ukui-city", "ukui-wallpapers", UKUI + "city.png", "Ubuntu Kylin community contributors", "CC-BY-SA-3.0", "render"),
    ("ukui-firstgeneration", "ukui-wallpapers", UKUI + "firstgeneration.jpg", "Ubuntu Kylin community contributors", "CC-BY-SA-3.0", "render"),
    ("ukui-goldfish", "ukui-wallpapers", UKUI + "goldfish.png", "Ubuntu Kylin community contributors", "CC-BY-SA-3.0", "render"),
    # scikit-image's bundled sample images (skimage/data; licences from skimage.data docstrings).
    ("coffee", "scikit-image", "data/coffee.png", "Rachel Michetti", "CC0-1.0", "train"),
    ("chelsea", "scikit-image", "data/chelsea.png", "Stefan van der Walt", "CC0-1.0", "train"),
    ("camera", "scikit-image", "data/camera.png", "Lav Varshney", "CC0-1.0", "train"),
    ("rocket", "scikit-image", "data/rocket.jpg", "SpaceX", "public domain", "train"),
    ("hubble", "scikit-image", "data/hubble_deep_field.jpg", "NASA", "public domain", "train"),
    ("retina", "scikit-image", "data/retina.jpg", "Mikael Häggström", "CC0-1.0", "train"),
    ("ihc", "scikit-image", "data/ihc.png", "Center for Microscopy and Molecular Imaging", "no known copyright restrictions", "train"),
    ("brick", "scikit-image", "data/brick.png", "CC0Textures (Bricks25)", "CC0-1.0", "train"),
    ("gravel", "scikit-image", "data/gravel.png", "CC0Textures (Gravel04)", "CC0-1.0", "train"),
    ("grass", "scikit-image", "data/grass.png", "\"linolafett\"", "CC0-1.0", "train"),
    ("astronaut", "scikit-image", "data/astronaut.png", "NASA (Eileen Collins)", "public domain", "test"),
]

TEST_SIZE = 512


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpack_debian_package(name, debs_dir):
    """Downloads (apt-get download, no install) and unpacks one package; returns (root, version)."""
    os.makedirs(debs_dir, exist_ok=True)
    debs = [f for f in os.listdir(debs_dir) if f.startswith(name + "_") and f.endswith(".deb")]
    if not debs:
        subprocess.run(["apt-get", "download", name], cwd=debs_dir, check=True)
        debs = [f for f in os.listdir(debs_dir) if f.startswith(name + "_") and f.endswith(".deb")]
    if len(debs) != 1:
        sys.exit(f"prepare_data: expected one {name}_*.deb in {debs_dir}, found {debs}")
    deb = os.path.join(debs_dir, debs[0])
    root = os.path.join(debs_dir, "root-" + name)
    if not os.path.isdir(root):
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    version = subprocess.run(["dpkg-deb", "-f", deb, "Version"], check=True, capture_output=True,
                             text=True).stdout.strip()
    return root, version


def center_square_512(img):
    """Largest centred square, resampled to TEST_SIZE with Lanczos (antialiased)."""
    w, h = img.size
    s = min(w, h)
    box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
    return img.resize((TEST_SIZE, TEST_SIZE), Image.LANCZOS, box=box, reducing_gap=3.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".carry/default_data")
    ap.add_argument("--fixtures", default="tests/fixtures/photos",
                    help="where the held-out 512x512 photos and their LICENSES.md go ('' to skip)")
    ap.add_argument("--debs", default="/tmp/latent-default-debs")
    ap.add_argument("--max-side", type=int, default=1536)
    args = ap.parse_args()

    import skimage  # only for the location and version of its bundled images
    skimage_root = os.path.dirname(skimage.__file__)

    os.makedirs(os.path.join(args.out, "train"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "eval"), exist_ok=True)
    if args.fixtures:
        os.makedirs(args.fixtures, exist_ok=True)

    roots = {}
    manifest = []
    total = 0
    for ident, source, path, author, licence, role in SOURCES:
        if source == "scikit-image":
            src = os.path.join(skimage_root, path)
            version = skimage.__version__
            where = f"scikit-image {version} wheel, skimage/{path}"
        else:
            if source not in roots:
                roots[source] = unpack_debian_package(source, args.debs)
            root, version = roots[source]
            src = os.path.join(root, path.lstrip("/"))
            where = f"Debian 12 package {source} {version}, {path}"
        if not os.path.isfile(src):
            sys.exit(f"prepare_data: {ident}: missing {src}")
        img = Image.open(src).convert("RGB")  # greyscale samples become 3 equal channels
        entry = dict(id=ident, source=source, version=version, path=path, where=where,
                     sha256=sha256(src), author=author, licence=licence, role=role,
                     original_size=list(img.size))
        if role == "test":
            out = center_square_512(img)
            dst = os.path.join(args.out, "eval", ident + ".png")
            out.save(dst, optimize=True)
            if args.fixtures:
                out.save(os.path.join(args.fixtures, ident + ".png"), optimize=True)
        else:
            scale = min(1.0, args.max_side / max(img.size))
            if scale < 1.0:
                size = (round(img.size[0] * scale), round(img.size[1] * scale))
                img = img.resize(size, Image.LANCZOS, reducing_gap=3.0)
            dst = os.path.join(args.out, "train", ident + ".jpg")
            img.save(dst, quality=95, subsampling=0)
        entry["stored"] = os.path.relpath(dst, args.out)
        entry["stored_size"] = list(Image.open(dst).size)
        total += os.path.getsize(dst)
        manifest.append(entry)
        print(f"{role:6s} {ident:20s} {entry['original_size']} -> {entry['stored_size']}  {licence}")

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
    counts = {r: sum(1 for m in manifest if m["role"] == r) for r in ("train", "render", "test")}
    print(f"prepare_data: {counts}, {total / 2**20:.1f} MiB in {args.out}")
    if total > 40 * 2**20:
        sys.exit("prepare_data: the data set is over 40 MiB; lower --max-side")

    if args.fixtures:
        write_fixture_licences(args.fixtures, [m for m in manifest if m["role"] == "test"])


def write_fixture_licences(folder, tests):
    lines = [
        "# Held-out test photographs",
        "",
        "512x512 photographs for the default autoencoder's quality test",
        "(tests/model/test_default_model_quality.cpp) and scripts/default_model/evaluate.py.",
        "They are **not** used in training: scripts/default_model/prepare_data.py marks them",
        "`test` and writes them only here and to its eval/ folder.",
        "Each is the largest centred square of the original, resampled to 512x512 (Lanczos).",
        "",
        "| file | original | author | licence | sha256 of the original |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in tests:
        lines.append(f"| {m['id']}.png | {m['where']} ({m['original_size'][0]}x{m['original_size'][1]}) "
                     f"| {m['author']} | {m['licence']} | `{m['sha256'][:16]}…` |")
    lines += [
        "",
        "Licence texts: CC-BY-4.0 <https://creativecommons.org/licenses/by/4.0/>;",
        "LGPL-3 and GPL-2+ as shipped in Debian (/usr/share/common-licenses/);",
        "the copyright files of the Debian packages (/usr/share/doc/<package>/copyright) give",
        "the full notices. The astronaut photograph (NASA) is in the public domain.",
        "",
    ]
    with open(os.path.join(folder, "LICENSES.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
