#!/usr/bin/env python3
"""The Spack repository (packaging/spack) checked offline, without Spack.

usage: check_spack.py SOURCE_DIR

Spack cannot be installed here, so each package.py is parsed with Python's
ast and checked against Spack's conventions and against the project:
  * repo.yaml names a namespace; packages/<name>/package.py for each package,
    and no package is named `dyad` (Spack's builtin dyad is upstream's);
  * package.py imports spack.package, defines one class named after its
    directory (dyad-cpp -> DyadCpp) deriving from CMakePackage, documented;
  * directives (version, variant, depends_on, conflicts, extends, license)
    sit in the class body; the version is the CMake project version;
  * the variants ucx, ofi, redis, munge, python and flux are declared with a
    boolean default and a description; every `when=` names a declared
    variant; each of ucx/ofi/redis/munge/python/flux has its dependency;
  * cmake_args() maps every variant with define_from_variant() to an option
    the project's CMake files really declare (option(), dyad_backend(OPTION),
    or a cache variable), and every other define() does too; except flux,
    whose option may not exist yet: then a conflicts("+flux") must say so
    (and once the option exists, that conflict must go).
"""

import ast
import glob
import os
import re
import sys

VARIANTS = {
    "ucx": "ucx",
    "ofi": "libfabric",
    "redis": "hiredis",
    "munge": "munge",
    "python": "python",
    "flux": "flux-core",
}
DIRECTIVES = {"version", "variant", "depends_on", "conflicts", "extends", "license",
              "requires", "provides", "patch", "resource", "maintainers"}


def cmake_options(src):
    """Options and cache variables declared by the project's CMake files."""
    names = set()
    files = [os.path.join(src, "CMakeLists.txt")]
    for pattern in ("cmake/*.cmake", "src/**/CMakeLists.txt", "python/CMakeLists.txt",
                    "tests/CMakeLists.txt", "bench/CMakeLists.txt"):
        files += glob.glob(os.path.join(src, pattern), recursive=True)
    for path in files:
        text = open(path, encoding="utf-8").read()
        names.update(re.findall(r"\boption\(\s*([A-Z][A-Z0-9_]+)", text))
        names.update(re.findall(r"\bOPTION\s+([A-Z][A-Z0-9_]+)", text))
        names.update(re.findall(r"\bset\(\s*([A-Z][A-Z0-9_]+)\s[^)]*\bCACHE\b", text))
    return names


def cmake_version(src):
    text = open(os.path.join(src, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(\s*dyad\s+VERSION\s+([0-9.]+)", text)
    return m.group(1) if m else None


def class_name(pkg):
    return "".join(part.capitalize() for part in re.split(r"[-_]", pkg))


def const_str(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def call_name(node):
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            return node.func.id
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
    return None


def kwarg(call, name):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def check_package(path, pkg, src, options, problems):
    def bad(msg):
        problems.append(f"{os.path.relpath(path, src)}: {msg}")

    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    if not any(isinstance(n, ast.ImportFrom) and n.module == "spack.package"
               for n in tree.body):
        bad("does not import from spack.package")
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    want = class_name(pkg)
    cls = next((c for c in classes if c.name == want), None)
    if cls is None:
        bad(f"no class {want} (Spack derives the class name from the directory '{pkg}'); "
            f"found {[c.name for c in classes]}")
        return
    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "?") for b in cls.bases]
    if "CMakePackage" not in bases:
        bad(f"class {want} derives from {bases}, not CMakePackage")
    if not ast.get_docstring(cls):
        bad(f"class {want} has no docstring (spack info shows it)")

    # Directives: calls at class-body level only.
    body_calls = [s.value for s in cls.body
                  if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if call_name(inner) in DIRECTIVES and isinstance(inner.func, ast.Name):
                    bad(f"directive {call_name(inner)}() inside method {node.name}()")
    calls = {}
    for c in body_calls:
        calls.setdefault(call_name(c), []).append(c)

    versions = [const_str(c.args[0]) for c in calls.get("version", []) if c.args]
    if not versions:
        bad("no version() directive")
    elif cmake_version(src) not in versions:
        bad(f"versions {versions} do not include the CMake project version {cmake_version(src)}")

    declared = {}
    for c in calls.get("variant", []):
        name = const_str(c.args[0]) if c.args else None
        default = kwarg(c, "default")
        if name is None:
            bad("variant() without a name")
            continue
        if not (isinstance(default, ast.Constant) and isinstance(default.value, bool)):
            bad(f"variant {name}: default must be True or False")
        if const_str(kwarg(c, "description")) is None:
            bad(f"variant {name}: no description")
        if name != name.lower():
            bad(f"variant {name}: Spack variant names are lower case")
        declared[name] = c
    for name in VARIANTS:
        if name not in declared:
            bad(f"variant {name} is not declared")

    def when_variants(call):
        when = const_str(kwarg(call, "when"))
        return re.findall(r"[+~]([a-z0-9_]+)", when) if when else []

    for kind in ("depends_on", "conflicts", "extends"):
        for c in calls.get(kind, []):
            for v in when_variants(c) + ([const_str(c.args[0])[1:]] if kind == "conflicts"
                                          and c.args and const_str(c.args[0]) else []):
                if v not in declared:
                    bad(f"{kind}({ast.unparse(c.args[0]) if c.args else ''}) names "
                        f"undeclared variant {v}")
    for name, dep in VARIANTS.items():
        found = any(const_str(c.args[0]) and const_str(c.args[0]).split("@")[0] == dep
                    and f"+{name}" in (const_str(kwarg(c, "when")) or "")
                    for kind in ("depends_on", "extends") for c in calls.get(kind, []) if c.args)
        if not found:
            bad(f"variant {name}: no depends_on/extends('{dep}', when='+{name}')")

    # cmake_args(): define_from_variant(OPTION, variant) per variant.
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "cmake_args"),
              None)
    if fn is None:
        bad("no cmake_args() method")
        return
    mapped = {}
    for node in ast.walk(fn):
        name = call_name(node)
        if name == "define_from_variant" and len(node.args) >= 2:
            opt, var = const_str(node.args[0]), const_str(node.args[1])
            if var in mapped:
                bad(f"variant {var} mapped twice")
            mapped[var] = opt
            if var not in declared:
                bad(f"define_from_variant({opt!r}, {var!r}): no such variant")
        elif name == "define" and node.args and const_str(node.args[0]):
            opt = const_str(node.args[0])
            if opt not in options:
                bad(f"define({opt!r}): not an option or cache variable of the project's CMake")
    for var in declared:
        if var not in mapped:
            bad(f"variant {var} is not passed to CMake (define_from_variant)")
    flux_pending = any(c.args and const_str(c.args[0]) == "+flux"
                       for c in calls.get("conflicts", []))
    for var, opt in mapped.items():
        if opt in options:
            if var == "flux" and flux_pending:
                bad(f"{opt} exists now: drop conflicts('+flux') and check the variant builds")
            continue
        if var == "flux" and flux_pending:
            continue  # declared ahead of the Flux integration, and said so
        bad(f"variant {var} maps to {opt}, which no CMake file of the project declares")


MUTATIONS = [  # (what, old, new): each must make the check fail
    ("class name", "class DyadCpp(", "class Dyadcpp("),
    ("variant not passed to CMake", 'self.define_from_variant("DYAD_ENABLE_OFI", "ofi"),', ""),
    ("unknown CMake option", '"DYAD_ENABLE_UCX"', '"DYAD_ENABLE_UCXX"'),
    ("undeclared variant in when=", 'when="+munge"', 'when="+mungee"'),
]


def self_test(path, pkg, src, options, problems):
    """The check itself: each mutation of the recipe must be caught."""
    import tempfile
    text = open(path, encoding="utf-8").read()
    for what, old, new in MUTATIONS:
        if old not in text:
            problems.append(f"self-test: '{old}' not in {pkg}/package.py (update MUTATIONS)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            mutated = os.path.join(tmp, "package.py")
            with open(mutated, "w", encoding="utf-8") as f:
                f.write(text.replace(old, new, 1))
            found = []
            check_package(mutated, pkg, src, options, found)
            if not found:
                problems.append(f"self-test: a broken recipe ({what}) passed the check")


def main():
    src = os.path.abspath(sys.argv[1])
    repo = os.path.join(src, "packaging", "spack")
    problems = []
    yaml = os.path.join(repo, "repo.yaml")
    if not os.path.isfile(yaml):
        problems.append("packaging/spack/repo.yaml missing")
    elif not re.search(r"^repo:\s*\n\s+namespace:\s*['\"]?[a-z_][a-z0-9_]*", open(yaml).read(),
                       re.M):
        problems.append("repo.yaml: no 'repo: namespace: <identifier>'")
    options = cmake_options(src)
    for must in ("DYAD_ENABLE_UCX", "DYAD_ENABLE_OFI", "DYAD_ENABLE_REDIS", "DYAD_ENABLE_MUNGE",
                 "DYAD_ENABLE_PYTHON", "DYAD_BUILD_TESTS"):
        if must not in options:
            problems.append(f"the option scan missed {must}: fix check_spack.py")
    pkgs = sorted(os.listdir(os.path.join(repo, "packages")))
    if not pkgs:
        problems.append("no package in packaging/spack/packages")
    for pkg in pkgs:
        if pkg == "dyad":
            problems.append("a package named 'dyad' would be confused with Spack's builtin dyad")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", pkg):
            problems.append(f"package directory '{pkg}': Spack names are lower case with dashes")
        path = os.path.join(repo, "packages", pkg, "package.py")
        if not os.path.isfile(path):
            problems.append(f"packages/{pkg}/package.py missing")
            continue
        check_package(path, pkg, src, options, problems)
        if pkg == "dyad-cpp":
            self_test(path, pkg, src, options, problems)
    if "dyad-cpp" in pkgs:
        readme = os.path.join(repo, "README.md")
        if not os.path.isfile(readme) or "builtin" not in open(readme).read():
            problems.append("packaging/spack/README.md must say why the name is not 'dyad'")
    for p in problems:
        print("check_spack:", p, file=sys.stderr)
    if problems:
        return 1
    print(f"spack repository OK: {', '.join(pkgs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
