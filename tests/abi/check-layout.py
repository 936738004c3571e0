#!/usr/bin/env python3
"""abi/src's layout stays as documented: every folder's module map (in its
header, after "The module map of abi/src/<folder>/:") lists exactly the .c
files the folder has, and a folder includes only its own header and those of
the layers before it (abi/src/README.md, "Layers, lowest first: ..."), so
there are no include cycles between folders.

usage: check-layout.py [SOURCE_DIR]"""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]) / "abi" / "src"
errors = []

readme = (root / "README.md").read_text()
m = re.search(r"^Layers, lowest first: (.+)$", readme, re.M)
if not m:
    sys.exit(f"{root}/README.md: no line 'Layers, lowest first: ...'")
layers = [x.strip() for x in m.group(1).split(",")]
folders = sorted(p.name for p in root.iterdir() if p.is_dir())
if sorted(layers) != folders:
    errors.append(f"README.md lists layers {layers}, but abi/src has folders {folders}")

for folder in folders:
    d = root / folder
    sources = sorted(p.name for p in d.glob("*.c"))
    maps = []
    for h in sorted(d.glob("*.h")):
        text = h.read_text()
        head = re.search(rf"The module map of abi/src/{folder}/:\n(.*?)\n \*\s*\n", text, re.S)
        if not head:
            head = re.search(rf"The module map of abi/src/{folder}/:\n(.*?)\*/", text, re.S)
        if head:
            maps.append((h.name, re.findall(r"^ \*   ([A-Za-z0-9_]+\.c)\s", head.group(1), re.M)))
    if len(maps) != 1:
        errors.append(f"abi/src/{folder}/: expected one header with 'The module map of abi/src/{folder}/:', found {len(maps)}")
        continue
    header, listed = maps[0]
    for name in sorted(set(sources) - set(listed)):
        errors.append(f"abi/src/{folder}/{name} is missing from the module map in {folder}/{header}")
    for name in sorted(set(listed) - set(sources)):
        errors.append(f"{folder}/{header}'s module map lists {name}, which abi/src/{folder}/ does not have")
    rank = layers.index(folder) if folder in layers else -1
    for f in sorted(list(d.glob("*.c")) + list(d.glob("*.h"))):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            bare = re.match(r'\s*#\s*include\s+"([^"/]+)"', line)
            if bare:
                errors.append(f"abi/src/{folder}/{f.name}:{n}: include \"{bare.group(1)}\" by its folder "
                              f"(\"<layer>/{bare.group(1)}\")")
            inc = re.match(r'\s*#\s*include\s+"([a-z_]+)/[^"]+"', line)
            if not inc or inc.group(1) == "ddplug":
                continue
            dep = inc.group(1)
            if dep not in layers:
                errors.append(f"abi/src/{folder}/{f.name}:{n}: includes {dep}/, which is not a layer")
            elif layers.index(dep) > rank:
                errors.append(f"abi/src/{folder}/{f.name}:{n}: the {folder} layer includes {dep}/, "
                              f"a later layer (order: {', '.join(layers)})")

if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"abi/src layout ok: {len(folders)} layers ({', '.join(layers)}), module maps match")
