#!/usr/bin/env python3
"""Static checks of the Metal kernels with clang (no Metal compiler needed).

Each cpp/shaders/*.metal file (and any file given) must pass all of these; the script prints
one line per file and exits non-zero if any fails:

1. C++ for OpenCL 2021 (clang -x clcpp), with msl.h mapping Metal's device, constant,
   threadgroup and thread address spaces to OpenCL's __global, __constant, __local and
   __private: mixing them fails as in Metal. No OpenCL option is enabled but half and the
   generic address space (clang needs it for implicit copies; check 2 catches the
   unqualified pointers it would accept), so double, and a double literal such as 1.0,
   fail; C++ for OpenCL itself refuses virtual functions, thread_local, register,
   exceptions and new.
2. C++14 (MSL 3 is based on C++14; -pedantic), the address spaces as distinct clang
   address_space attributes, with no exceptions, no RTTI and no C++ standard library
   (-nostdinc: std:: and #include <cmath> fail).
3. Over the C++14 AST: no lambda, goto, recursion (direct or mutual), noexcept operator,
   typeid, dynamic_cast, new or delete, nor derived class (MSL's restrictions).
4. Over the source as the Metal compiler sees it (preprocessed with __METAL_VERSION__):
   every [[attribute]] is one MSL defines, with the arguments it takes; every kernel
   argument has exactly one of [[buffer(i)]], [[threadgroup(i)]] or a thread-position
   attribute (the host code binds by index, so no index is left implicit), indices are
   unique per kernel and within Metal's limits, function_constant(name) names a function
   constant; and no std::.

Warnings are errors, except three that MSL source cannot avoid under clang: Metal's
attributes are unknown to clang (4 checks them instead), kernels take arguments they do not
read (a shared parameter list), and `constant const T` is valid MSL while msl.h's `constant`
already carries const.

    python cpp/shaders/check/check_msl.py            # the kernels
    python cpp/shaders/check/check_msl.py extra.metal  # the kernels and extra.metal
    python cpp/shaders/check/check_msl.py --only extra.metal

The compiler: $CLANGXX, else clang++ or clang++-19 ... clang++-14 on PATH (apt's `clang`).
"""

import argparse
import difflib
import os
import pathlib
import re
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import msl_source  # noqa: E402

CHECK_DIR = msl_source.CHECK_DIR
SHADER_DIR = msl_source.SHADER_DIR
HEADER = CHECK_DIR / "msl.h"

CANDIDATES = ["clang++"] + [f"clang++-{v}" for v in range(19, 13, -1)]

COMMON = [
    "-fsyntax-only",
    "-nostdinc",
    "-pedantic",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unknown-attributes",
    "-Wno-unused-parameter",
]
OPENCL = [
    "-target",
    "spir64",
    "-x",
    "clcpp",
    "-cl-std=clc++2021",
    "-cl-no-stdinc",
    "-Xclang",
    "-cl-ext=-all,+cl_khr_fp16,+__opencl_c_generic_address_space",
]
CPP14 = [
    "-x",
    "c++",
    "-std=c++14",
    "-nostdinc++",
    "-fno-exceptions",
    "-fno-rtti",
    "-Wno-duplicate-decl-specifier",
]

# ---- rule 4: the attributes MSL defines ------------------------------------------------------
# Metal Shading Language Specification (3.x), "Attributes for kernel function input
# arguments"; nothing else is a thread-position attribute.
KERNEL_INPUTS = (
    "dispatch_quadgroups_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup",
    "dispatch_threads_per_threadgroup",
    "grid_origin",
    "grid_size",
    "quadgroup_index_in_threadgroup",
    "quadgroups_per_threadgroup",
    "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup",
    "thread_execution_width",
    "thread_index_in_quadgroup",
    "thread_index_in_simdgroup",
    "thread_index_in_threadgroup",
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threadgroups_per_grid",
    "threads_per_grid",
    "threads_per_simdgroup",
    "threads_per_threadgroup",
)
# Attributes binding a kernel argument to an argument-table slot (one integer index).
RESOURCES = {"buffer": 30, "texture": 127, "sampler": 15, "threadgroup": 30}
# Every attribute MSL defines (the specification's chapter on function and variable
# attributes, and C++14's), by its arguments: None for none, "index" for one integer
# constant expression, "any" for the graphics attributes this project does not use (their
# argument forms are not checked).
MSL_ATTRIBUTES = {
    **{name: None for name in KERNEL_INPUTS},
    **{name: "index" for name in RESOURCES},
    "function_constant": "function_constant",
    "host_name": "string",  # an explicit instance's name in the metallib
    "max_total_threads_per_threadgroup": "index",
    "max_total_threadgroups_per_mesh_grid": "index",
    "id": "index",
    "attribute": "index",
    "color": "any",
    "raster_order_group": "index",
    "user": "any",
    "depth": "any",
    "patch": "any",
    "intersection": "any",
    "imageblock_data": "any",
    **{
        name: None
        for name in (
            "kernel",
            "vertex",
            "fragment",
            "visible",
            "stitchable",
            "object",
            "mesh",
            "payload",
            "stage_in",
            "early_fragment_tests",
            "position",
            "point_size",
            "clip_distance",
            "render_target_array_index",
            "viewport_array_index",
            "invariant",
            "vertex_id",
            "instance_id",
            "base_vertex",
            "base_instance",
            "amplification_id",
            "amplification_count",
            "front_facing",
            "point_coord",
            "sample_id",
            "sample_mask",
            "stencil",
            "primitive_id",
            "barycentric_coord",
            "flat",
            "center_perspective",
            "center_no_perspective",
            "centroid_perspective",
            "centroid_no_perspective",
            "sample_perspective",
            "sample_no_perspective",
            "patch_id",
            "position_in_patch",
            "primitive_culled",
            "shared",
        )
    },
    # C++14's.
    "noreturn": None,
    "carries_dependency": None,
    "deprecated": "any",
}

# ---- rule 3: MSL's restrictions, as clang AST nodes ------------------------------------------
FORBIDDEN_NODES = {
    "LambdaExpr": "lambda expressions are not MSL",
    "GotoStmt": "goto is not MSL",
    "IndirectGotoStmt": "goto is not MSL",
    "CXXNoexceptExpr": "the noexcept operator is not MSL",
    "CXXTypeidExpr": "typeid is not MSL",
    "CXXDynamicCastExpr": "dynamic_cast is not MSL",
    "CXXNewExpr": "new is not MSL",
    "CXXDeleteExpr": "delete is not MSL",
    "CXXThrowExpr": "exceptions are not MSL",
    "CXXTryStmt": "exceptions are not MSL",
}
FUNCTION_NODES = (
    "FunctionDecl",
    "CXXMethodDecl",
    "CXXConstructorDecl",
    "CXXDestructorDecl",
    "CXXConversionDecl",
)


def find_clang():
    """The clang++ to use: $CLANGXX if set (None if it is not an executable), else the first
    of clang++, clang++-19 ... clang++-14 on PATH, else None."""
    configured = os.environ.get("CLANGXX")
    if configured:
        return shutil.which(configured)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def kernel_sources():
    """Every .metal file of cpp/shaders, sorted."""
    return sorted(SHADER_DIR.glob("*.metal"))


def commands(clang, source):
    """The two clang command lines of checks 1 and 2 (the second dumps the AST for 3)."""
    includes = ["-include", str(HEADER), "-I", str(msl_source.STDLIB_DIR), "-I", str(SHADER_DIR)]
    return {
        "C++ for OpenCL": [str(clang), *COMMON, *OPENCL, *includes, str(source)],
        "C++14": [str(clang), *COMMON, *CPP14, *includes, "-Xclang", "-ast-dump", str(source)],
    }


# ---- the AST rules ---------------------------------------------------------------------------
_AST_LINE = re.compile(r"^(?P<prefix>[| `]*[|`]-)?(?P<node>\S+)(?P<rest>.*)$")
_LOCATION = re.compile(
    r"line:(?P<line>\d+):\d+|col:\d+|(?P<file>[^\s<>,:'\"][^<>,:'\"]*):(?P<fline>\d+):\d+"
)
_ADDRESS = re.compile(r"^ (0x[0-9a-f]+)")
_PREVIOUS = re.compile(r" prev (0x[0-9a-f]+)")
_CALLEE = re.compile(
    r"(?:lvalue (?:Function|CXXMethod) (0x[0-9a-f]+) '([^']*)')"
    r"|(?:'<bound member function type>' (?:->|\.)\S+ (0x[0-9a-f]+))"
)
_DECL_NAME = re.compile(r" (?:(?:used|referenced|implicit|constexpr|inline|invalid) )*([~\w]+) '")


def ast_findings(dump):
    """Findings of rule 3 in a clang -ast-dump text: (file, line, message)."""
    findings = []
    file, line = "", 0
    stack = []  # (depth, function address) enclosing the current line
    canonical = {}  # declaration address -> first declaration's address
    names = {}
    calls = {}  # caller -> {callee}
    record_depth = None  # depth of the class definition whose children are being read
    for text in dump.splitlines():
        m = _AST_LINE.match(text)
        if not m:
            continue
        depth = len(m.group("prefix") or "") // 2
        node, rest = m.group("node"), m.group("rest")
        # The locations (range, then the node's own) come before any quoted name or type;
        # like clang, carry the file and line over from the last one printed.
        for loc in _LOCATION.finditer(rest.split("'", 1)[0]):
            if loc.group("file"):
                file, line = loc.group("file"), int(loc.group("fline"))
            elif loc.group("line"):
                line = int(loc.group("line"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if record_depth is not None and depth <= record_depth:
            record_depth = None

        if node in FORBIDDEN_NODES:
            findings.append((file, line, FORBIDDEN_NODES[node]))
        elif node == "CXXRecordDecl" and " definition" in rest and " implicit " not in rest:
            record_depth = depth
        elif (
            record_depth is not None
            and depth == record_depth + 1
            and re.match(r"(virtual )?(public|protected|private) '", node + rest)
        ):
            findings.append((file, line, "derived classes are not MSL"))
        elif node in FUNCTION_NODES:
            address = _ADDRESS.match(rest)
            if address:
                addr = address.group(1)
                previous = _PREVIOUS.search(rest)
                first = previous.group(1) if previous else addr
                canonical[addr] = canonical.get(first, first)
                name = _DECL_NAME.search(rest.split(">", 1)[-1])
                # The last declaration's place: the definition, usually.
                names[canonical[addr]] = (name.group(1) if name else addr, file, line)
                stack.append((depth, canonical[addr]))
        elif stack:
            callee = _CALLEE.search(rest)
            if callee:
                target = callee.group(1) or callee.group(3)
                calls.setdefault(stack[-1][1], set()).add(target)

    # Recursion: a cycle in the call graph (over canonical declarations).
    graph = {caller: {canonical.get(c, c) for c in callees} for caller, callees in calls.items()}
    for component in _cycles(graph):
        start = min(component, key=lambda f: names.get(f, (f,))[0])
        chain = _path_back(graph, start, set(component))
        _, file_, line_ = names.get(start, (start, "", 0))
        text = " -> ".join(names.get(f, (f,))[0] for f in chain)
        findings.append((file_, line_, f"recursion is not MSL: {text}"))
    return findings


def _path_back(graph, start, component):
    """A call path from `start` back to itself within `component` (breadth first)."""
    previous = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for w in sorted(graph.get(node, ())):
            if w == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if w in component and w not in previous:
                previous[w] = node
                queue.append(w)
    return [start, start]


def _cycles(graph):
    """One representative cycle per strongly connected component that has one (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            advanced = False
            for w in edges:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# ---- the source rules ------------------------------------------------------------------------
def source_findings(tokens):
    """Findings of rule 4 in the tokens of a source preprocessed as Metal sees it."""
    findings = []
    where = lambda token: (token.file, token.line)  # noqa: E731
    known = msl_source.enumerators(tokens)
    for i, token in enumerate(tokens):
        if (
            msl_source.from_project(token)
            and token.text == "std"
            and i + 1 < len(tokens)
            and tokens[i + 1].text == "::"
        ):
            findings.append((*where(token), "MSL has no C++ standard library (std::)"))

    kernels = msl_source.kernels(tokens)
    # Attribute tokens are shared by both lists, so identity tells kernel arguments apart.
    on_arguments = {id(a.token) for k in kernels for p in k.parameters for a in p.attributes}
    everywhere = msl_source.attributes(tokens)
    # Program-scope function constants: `constant T name [[function_constant(i)]]`.
    constants = {
        a.before.text
        for a in everywhere
        if a.name == "function_constant" and id(a.token) not in on_arguments and a.before
    }
    for attribute in everywhere:
        findings.extend(
            _attribute_findings(attribute, id(attribute.token) in on_arguments, constants, known)
        )

    for kernel in kernels:
        used = {}
        for parameter in kernel.parameters:
            binding = [a for a in parameter.attributes if a.name != "function_constant"]
            what = f"kernel {kernel.name}: argument '{parameter.name}'"
            if len(binding) != 1:
                findings.append(
                    (
                        *where(parameter.token),
                        f"{what} needs exactly one of [[buffer(i)]], [[threadgroup(i)]], "
                        "[[texture(i)]], [[sampler(i)]] or a thread-position attribute",
                    )
                )
                continue
            attribute = binding[0]
            if attribute.name in RESOURCES and attribute.args and len(attribute.args) == 1:
                value = msl_source.integer(attribute.args[0], known)
                if value is None:
                    continue
                key = (attribute.name, value)
                if key in used:
                    findings.append(
                        (
                            *where(parameter.token),
                            f"{what}: [[{attribute.name}({value})]] is also argument '{used[key]}'",
                        )
                    )
                used[key] = parameter.name
    return findings


def _attribute_findings(attribute, on_kernel_argument, constants, known):
    token = attribute.token
    name = attribute.name
    if name not in MSL_ATTRIBUTES:
        close = difflib.get_close_matches(name, MSL_ATTRIBUTES, n=1)
        hint = f" (did you mean [[{close[0]}]]?)" if close else ""
        return [(token.file, token.line, f"[[{name}]] is not an attribute MSL defines{hint}")]
    form = MSL_ATTRIBUTES[name]
    args = attribute.args
    if form is None and args is not None:
        return [(token.file, token.line, f"[[{name}]] takes no arguments")]
    if form == "index":
        if not args or len(args) != 1 or not args[0]:
            return [(token.file, token.line, f"[[{name}(i)]] takes one index")]
        value = msl_source.integer(args[0], known)
        limit = RESOURCES.get(name)
        if value is not None and (value < 0 or (limit is not None and value > limit)):
            return [(token.file, token.line, f"[[{name}({value})]]: index outside 0..{limit}")]
    if form == "string" and (
        not args or len(args) != 1 or len(args[0]) != 1 or args[0][0].kind != "string"
    ):
        return [(token.file, token.line, f"[[{name}]] takes one string")]
    if form == "function_constant":
        if not args or len(args) != 1 or not args[0]:
            return [(token.file, token.line, "[[function_constant]] takes an index or a name")]
        if on_kernel_argument:
            if len(args[0]) != 1 or args[0][0].text not in constants:
                text = " ".join(t.text for t in args[0])
                return [
                    (
                        token.file,
                        token.line,
                        f"[[function_constant({text})]]: {text} is not a function constant",
                    )
                ]
    return []


# ---- running the checks ----------------------------------------------------------------------
def check(clang, source):
    """Runs every check on one file: (passed, diagnostics)."""
    runs = {
        what: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for what, command in commands(clang, source).items()
    }
    output = []
    passed = True
    try:
        tokens = msl_source.tokenize(msl_source.preprocess(clang, source))
        findings = source_findings(tokens)
    except msl_source.SourceError as e:
        findings = [("", 0, str(e))]
    for what, run in runs.items():
        stdout, stderr = run.communicate()
        if run.returncode != 0:
            passed = False
            output.append(f"-- {what}:\n{stderr}")
        if what == "C++14":
            findings.extend(ast_findings(stdout))
    if findings:
        passed = False
        output.append("-- MSL rules:\n")
        for file, line, message in sorted(set(findings)):
            output.append(f"{file}:{line}: error: {message}\n")
    return passed, "".join(output)


def _display(path):
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=pathlib.Path, help="extra files to check")
    parser.add_argument(
        "--only", action="store_true", help="check only the given files, not the kernels"
    )
    args = parser.parse_args(argv)

    clang = find_clang()
    if clang is None:
        wanted = os.environ.get("CLANGXX") or " / ".join(CANDIDATES)
        print(f"error: no clang++ found ({wanted}); install clang or set CLANGXX", file=sys.stderr)
        return 2
    sources = ([] if args.only else kernel_sources()) + list(args.files)
    if not sources:
        print("error: nothing to check", file=sys.stderr)
        return 2

    print(f"MSL static checks with {clang}", file=sys.stderr)
    failed = 0
    for source in sources:
        passed, output = check(clang, source)
        print(f"{'ok  ' if passed else 'FAIL'} {_display(source)}", flush=True)
        if not passed:
            failed += 1
            sys.stderr.write(output)
            sys.stderr.flush()
    if failed:
        print(f"{failed} of {len(sources)} files failed the MSL static checks", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
