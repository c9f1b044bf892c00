"""The kernels as the Metal compiler reads them: preprocessed as MSL 3.1 (__METAL_VERSION__
and __HAVE_BFLOAT__ defined, so the bfloat instances are read too; include/metal_stdlib
stands in for Metal's), split into tokens, with every [[attribute]]
and every kernel's parameter list. Used by check_msl.py (the static checks) and by
emulator_signatures.py (the host emulator's argument tables, at build time); standard
library only, and any C preprocessor that takes -E -nostdinc -D -I (gcc, clang).
"""

import dataclasses
import pathlib
import re
import subprocess

CHECK_DIR = pathlib.Path(__file__).resolve().parent
SHADER_DIR = CHECK_DIR.parent
STDLIB_DIR = CHECK_DIR / "include"


class SourceError(Exception):
    """A kernel source this module cannot read (or a preprocessor failure)."""


def preprocess(cpp, source, include_dirs=()):
    """The text of `source` after the preprocessor `cpp` (a compiler driver), as the Metal
    compiler sees it (include/project_macros.h first), with line markers."""
    command = [
        str(cpp),
        "-E",
        "-x",
        "c++",
        "-nostdinc",
        "-D__METAL_VERSION__=310",
        "-D__HAVE_BFLOAT__=1",
        "-include",
        str(STDLIB_DIR / "project_macros.h"),
        "-I",
        str(STDLIB_DIR),
        "-I",
        str(SHADER_DIR),
    ]
    for directory in include_dirs:
        command += ["-I", str(directory)]
    result = subprocess.run([*command, str(source)], capture_output=True, text=True)
    if result.returncode != 0:
        raise SourceError(f"preprocessing {source} failed:\n{result.stderr}")
    return result.stdout


@dataclasses.dataclass(frozen=True)
class Token:
    text: str
    kind: str  # "name", "number", "string", "punct"
    file: str
    line: int


_TOKEN = re.compile(
    r"""
    (?P<string>[uUL]?R?"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>\.?\d(?:[\w.]|[eEpP][+-])*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<punct>::|->\*?|\.\.\.|<<=?|>>=?|[-+*/%&|^=!<>]=|&&|\|\||\+\+|--|\#\#|[^\s\w])
    """,
    re.VERBOSE,
)
_LINE_MARKER = re.compile(r'#\s*(?:line\s+)?(\d+)\s+"((?:[^"\\]|\\.)*)"')


def tokenize(text):
    """Tokens of preprocessed text, each with the file and line it came from."""
    tokens = []
    file, line = "", 0
    for raw in text.splitlines():
        marker = _LINE_MARKER.match(raw)
        if marker:
            line = int(marker.group(1))
            file = marker.group(2).encode().decode("unicode_escape")
            continue
        if raw.lstrip().startswith("#"):  # a #pragma the preprocessor passed through
            line += 1
            continue
        for match in _TOKEN.finditer(raw):
            tokens.append(Token(match.group(), match.lastgroup, file, line))
        line += 1
    return tokens


def from_project(token):
    """Whether a token comes from the kernels (or a checked file), not from the stand-in
    standard library or the preprocessor's built-ins."""
    if not token.file or token.file.startswith("<"):
        return False
    try:
        pathlib.Path(token.file).resolve().relative_to(STDLIB_DIR)
        return False
    except ValueError:
        return True


@dataclasses.dataclass
class Attribute:
    name: str  # with its scope: "buffer", "gnu::noinline"
    args: list  # one token list per comma-separated argument; None without parentheses
    token: Token  # where it is written
    before: Token  # the token before its `[[` (None at the start)


def _matching(tokens, i, open_, close):
    """Index of the bracket closing tokens[i] (an `open_`)."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].text == open_:
            depth += 1
        elif tokens[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    raise SourceError(f"{tokens[i].file}:{tokens[i].line}: unbalanced '{open_}'")


def _split_commas(tokens):
    """Top-level comma-separated pieces of a token list (brackets of every kind nest)."""
    pieces, current, depth = [], [], 0
    for token in tokens:
        if token.text in "([{":
            depth += 1
        elif token.text in ")]}":
            depth -= 1
        if token.text == "," and depth == 0:
            pieces.append(current)
            current = []
        else:
            current.append(token)
    if current or pieces:
        pieces.append(current)
    return pieces


def attribute_specifier_at(tokens, i):
    """If tokens[i] opens an attribute-specifier `[[ ... ]]`: (its attributes, index of the
    last `]`); else None."""
    # `[[` opens an attribute-specifier everywhere in MSL (only a lambda, which MSL does not
    # have, could follow a `[` of a subscript).
    if not (tokens[i].text == "[" and i + 1 < len(tokens) and tokens[i + 1].text == "["):
        return None
    end = _matching(tokens, i + 1, "[", "]")
    if end + 1 >= len(tokens) or tokens[end + 1].text != "]":
        return None
    attributes = []
    for piece in _split_commas(tokens[i + 2 : end]):
        if not piece:
            continue
        head, rest = [], piece
        while rest and rest[0].text != "(":
            head.append(rest[0])
            rest = rest[1:]
        name = "".join(t.text for t in head)
        args = None
        if rest:
            close = _matching(rest, 0, "(", ")")
            args = _split_commas(rest[1:close])
            if close != len(rest) - 1:
                raise SourceError(f"{piece[0].file}:{piece[0].line}: cannot read attribute {name}")
        attributes.append(Attribute(name, args, piece[0], tokens[i - 1] if i > 0 else None))
    return attributes, end + 1


def attributes(tokens):
    """Every attribute written in the project's tokens, in order."""
    found = []
    i = 0
    while i < len(tokens):
        spec = attribute_specifier_at(tokens, i) if from_project(tokens[i]) else None
        if spec:
            found.extend(spec[0])
            i = spec[1] + 1
        else:
            i += 1
    return found


@dataclasses.dataclass
class Parameter:
    name: str
    type_tokens: list
    attributes: list  # of Attribute
    token: Token


@dataclasses.dataclass
class Kernel:
    name: str
    parameters: list  # of Parameter
    token: Token
    template: bool = False  # a kernel template: its instances are the functions Metal sees


@dataclasses.dataclass
class Instance:
    """`template [[host_name("name")]] [[kernel]] decltype(f<...>) f<...>;`"""

    name: str  # the host name
    kernel: str  # the template's name
    expression: str  # `f<...>` as written
    token: Token


def _strip_attributes(tokens):
    """(tokens without their attribute-specifiers, the attributes)."""
    plain, found = [], []
    i = 0
    while i < len(tokens):
        spec = attribute_specifier_at(tokens, i)
        if spec:
            found.extend(spec[0])
            i = spec[1] + 1
        else:
            plain.append(tokens[i])
            i += 1
    return plain, found


def _in_attribute(tokens, i):
    """Whether tokens[i] is the first word of an attribute-specifier (`[[kernel]]`)."""
    return i >= 2 and tokens[i - 1].text == "[" and tokens[i - 2].text == "["


def _opens_template(tokens, i):
    """Whether tokens[i] follows a `template <...>` head."""
    if i == 0 or tokens[i - 1].text != ">":
        return False
    depth = 0
    for j in range(i - 1, -1, -1):
        depth += {">": 1, "<": -1}.get(tokens[j].text, 0)
        if depth == 0:
            return j > 0 and tokens[j - 1].text == "template"
    return False


def kernels(tokens):
    """Every `kernel void name(...)` in the project's tokens (plain or a template), with its
    parameters."""
    found = []
    for i, token in enumerate(tokens):
        if token.text != "kernel" or not from_project(token) or _in_attribute(tokens, i):
            continue
        if i + 3 >= len(tokens) or tokens[i + 1].text != "void" or tokens[i + 2].kind != "name":
            raise SourceError(f"{token.file}:{token.line}: write a kernel `kernel void name(...)`")
        if tokens[i + 3].text != "(":
            raise SourceError(f"{token.file}:{token.line}: cannot read kernel {tokens[i + 2].text}")
        close = _matching(tokens, i + 3, "(", ")")
        parameters = []
        for piece in _split_commas(tokens[i + 4 : close]):
            plain, attrs = _strip_attributes(piece)
            names = [t for t in plain if t.kind == "name"]
            if not names:
                raise SourceError(f"{token.file}:{token.line}: unnamed parameter of kernel")
            parameters.append(Parameter(names[-1].text, plain[:-1], attrs, piece[0]))
        found.append(Kernel(tokens[i + 2].text, parameters, token, _opens_template(tokens, i)))
    return found


def instances(tokens):
    """Every explicit instance of a kernel template, written
    `template [[host_name("name")]] [[kernel]] decltype(f<...>) f<...>;`."""
    found = []
    for i, token in enumerate(tokens):
        if token.text != "template" or not from_project(token):
            continue
        j, names = i + 1, []
        while j < len(tokens) and (spec := attribute_specifier_at(tokens, j)):
            names.extend(spec[0])
            j = spec[1] + 1
        host = [a for a in names if a.name == "host_name"]
        if not host:
            continue
        where = f"{token.file}:{token.line}"
        args = host[0].args
        if not args or len(args) != 1 or len(args[0]) != 1 or args[0][0].kind != "string":
            raise SourceError(f"{where}: [[host_name]] takes one string")
        if j + 1 >= len(tokens) or tokens[j].text != "decltype" or tokens[j + 1].text != "(":
            raise SourceError(f"{where}: write an instance `decltype(f<...>) f<...>;`")
        close = _matching(tokens, j + 1, "(", ")")
        inner = tokens[j + 2 : close]
        if len(inner) < 2 or inner[0].kind != "name" or inner[1].text != "<":
            raise SourceError(f"{where}: cannot read the instance's template")
        found.append(
            Instance(args[0][0].text[1:-1], inner[0].text, " ".join(t.text for t in inner), token)
        )
    return found


def enumerators(tokens):
    """Values of the enumerators the project defines (those with a literal value or an
    implicit one), by name."""
    values = {}
    for i, token in enumerate(tokens):
        if token.text != "enum" or not from_project(token):
            continue
        j = i + 1
        while j < len(tokens) and tokens[j].text not in ("{", ";"):
            j += 1
        if j >= len(tokens) or tokens[j].text != "{":
            continue
        close = _matching(tokens, j, "{", "}")
        following = 0
        for piece in _split_commas(tokens[j + 1 : close]):
            if not piece:
                continue
            value = following
            if len(piece) >= 3 and piece[1].text == "=":
                value = integer(piece[2:], values)
            if value is not None:
                values[piece[0].text] = value
                following = value + 1
    return values


def integer(tokens, known):
    """The value of an index expression: an integer literal, an enumerator, or a
    parenthesised one; None for anything else."""
    while len(tokens) >= 2 and tokens[0].text == "(" and tokens[-1].text == ")":
        tokens = tokens[1:-1]
    if len(tokens) == 2 and tokens[0].text == "-":
        inner = integer(tokens[1:], known)
        return None if inner is None else -inner
    if len(tokens) != 1:
        return None
    text = tokens[0].text
    if tokens[0].kind == "number":
        try:
            return int(text.rstrip("uUlL"), 0)
        except ValueError:
            return None
    return known.get(text)
