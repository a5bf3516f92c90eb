#!/usr/bin/env python3
"""The layer map, enforced: every `#include "qkv/<layer>/..."` in src/, include/, cli/ and python/ must be an edge
of ALLOWED below (imports point down only), and no relative `#include "../..."` may reach a private header of
another layer (src/<layer>/x.h is its own layer's; others include the public qkv/<layer>/ headers). Run by ctest
as `layer_map_has_no_upward_include`.

Usage: check_layers.py REPO_ROOT     exits 1 and lists each offending file:line and edge."""
import os
import re
import sys

# layer -> the layers it may include (besides itself). Bottom to top; README.md "What is inside" shows the same map.
ALLOWED = {
    "core": set(),
    "kernels": {"core"},
    "ops": {"core", "kernels"},
    "nn": {"core", "kernels", "ops"},
    "text": {"core"},
    "models": {"core", "kernels", "ops", "nn", "text"},
    "decode": {"core", "kernels", "ops", "nn", "models", "text"},
    "serve": {"core", "kernels", "ops", "nn", "models", "decode", "text"},
    "data": {"core"},
    "parallel": {"core", "kernels", "ops"},
    "train": {"core", "kernels", "ops", "nn", "models", "decode", "data", "parallel", "text"},
    "plot": {"core"},
    "corpus": {"core", "data"},
    "eval": {"core"},
    "experiments": {"core", "kernels", "ops", "nn", "models", "decode", "data", "parallel", "train", "plot", "corpus",
                    "eval", "text"},
    "cli": {"core", "kernels", "ops", "nn", "models", "decode", "data", "parallel", "train", "plot", "corpus", "eval",
            "experiments", "text", "serve"},
    "python": {"core", "kernels", "ops", "nn", "models", "decode", "data", "parallel", "train", "plot", "corpus", "eval",
               "experiments", "text", "serve"},
}
# The layers of the second library, qkv_extras (CMakeLists.txt: QKV_EXTRAS_LAYERS); every other folder of src/ is
# libqkv, the attention library, and none of those may include an extras layer.
EXTRAS = {"plot", "corpus", "eval", "experiments"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"qkv/([A-Za-z_]+)/', re.M)
RELATIVE = re.compile(r'^\s*#\s*include\s+"(\.\./[^"]+)"', re.M)


def layer_of(path):
    """The layer a source file belongs to, from its folder."""
    parts = path.split(os.sep)
    if parts[0] in ("cli", "python"):
        return parts[0]
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "include" and len(parts) > 3 and parts[1] == "qkv":
        return parts[2]
    return None


def main(root):
    bad, seen = [], 0
    for top in ("src", "include", "cli", "python"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".hpp", ".cpp", ".cc")):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                layer = layer_of(rel)
                if layer is None:
                    bad.append(f"{rel}: a source file outside any layer folder")
                    continue
                if layer not in ALLOWED:
                    bad.append(f"{rel}: folder '{layer}' is not in the layer table")
                    continue
                text = open(full, encoding="utf-8").read()
                for m in INCLUDE.finditer(text):
                    seen += 1
                    dep = m.group(1)
                    if dep != layer and dep not in ALLOWED[layer]:
                        line = text.count("\n", 0, m.start()) + 1
                        bad.append(f"{rel}:{line}: {layer} -> {dep} is not an allowed edge")
                for m in RELATIVE.finditer(text):
                    target = os.path.relpath(os.path.normpath(os.path.join(dirpath, m.group(1))), root)
                    owner = layer_of(target) if target.startswith("src" + os.sep) else None
                    if owner is not None and owner != layer:
                        line = text.count("\n", 0, m.start()) + 1
                        bad.append(f"{rel}:{line}: {layer} includes {target}, a private header of {owner}; "
                                   f"include its public qkv/{owner}/ header")
    if seen == 0:
        bad.append("no qkv include found: wrong root?")
    for layer, deps in ALLOWED.items():
        if layer not in EXTRAS and layer not in ("cli", "python") and deps & EXTRAS:
            bad.append(f"table: library layer '{layer}' may include extras {sorted(deps & EXTRAS)}")
    cmake = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"set\(QKV_EXTRAS_LAYERS([^)]*)\)", cmake)
    if not m or set(m.group(1).split()) != EXTRAS:
        bad.append(f"CMakeLists.txt: QKV_EXTRAS_LAYERS is {m.group(1).split() if m else 'missing'}, the table says "
                   f"{sorted(EXTRAS)}")
    for name in sorted(os.listdir(os.path.join(root, "src"))):
        if os.path.isdir(os.path.join(root, "src", name)) and name not in ALLOWED:
            bad.append(f"src/{name}: folder is not in the layer table")
    for b in bad:
        print(b)
    print(f"layer map: {seen} includes checked, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
