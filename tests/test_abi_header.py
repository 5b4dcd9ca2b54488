"""Layout proof (a): compile the system's real uapi header with gcc and compare every struct
size, every field offset and every request number it defines with kfdtool.ioctls."""
import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pycparser import CParser, c_ast

import kfdtool.ioctls as k

HEADER = Path("/usr/include/linux/kfd_ioctl.h")
GCC_FLAGS = ["-D__attribute__(x)=", "-D__extension__=", "-D__signed__=signed", "-D__inline__=",
             "-D__asm__(x)="]


@pytest.fixture(scope="module")
def header_build(tmp_path_factory):
    assert HEADER.exists(), "linux-libc-dev's kfd_ioctl.h is required (.ci/run installs it)"
    assert shutil.which("gcc"), "gcc is required (.ci/run installs it)"
    work = tmp_path_factory.mktemp("kfdhdr")
    (work / "drm").mkdir()
    # kfd_ioctl.h includes <drm/drm.h> only for __u32 & co and the _IO* macros.
    (work / "drm" / "drm.h").write_text("#include <linux/types.h>\n#include <linux/ioctl.h>\n")
    text = HEADER.read_text()
    minor = int(re.search(r"KFD_IOCTL_MINOR_VERSION\s+(\d+)", text).group(1))
    pre = subprocess.run(["gcc", "-E", "-P", f"-I{work}", *GCC_FLAGS, str(HEADER)],
                         check=True, capture_output=True, text=True).stdout
    structs = _struct_fields(CParser().parse(pre))
    macros = sorted(set(re.findall(r"#define\s+(AMDKFD_IOC_\w+)\s+\\?\s*AMDKFD_IO", text.replace("\\\n", " "))))
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/kfd_ioctl.h>", "int main(void) {"]
    for name, fields in structs.items():
        lines.append(f'printf("S {name} %zu\\n", sizeof(struct {name}));')
        for f in fields:
            lines.append(f'printf("F {name} {f} %zu\\n", offsetof(struct {name}, {f}));')
    for m in macros:
        lines.append(f'printf("R {m} %lu\\n", (unsigned long){m});')
    lines.append("return 0; }")
    (work / "probe.c").write_text("\n".join(lines))
    subprocess.run(["gcc", f"-I{work}", "-o", str(work / "probe"), str(work / "probe.c")], check=True)
    out = subprocess.run([str(work / "probe")], check=True, capture_output=True, text=True).stdout
    sizes, offsets, requests = {}, {}, {}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "S":
            sizes[rest[0]] = int(rest[1])
        elif kind == "F":
            offsets[(rest[0], rest[1])] = int(rest[2])
        else:
            requests[rest[0]] = int(rest[1])
    return {"minor": minor, "sizes": sizes, "offsets": offsets, "requests": requests}


def _struct_fields(ast):
    """struct name -> field names, anonymous unions flattened (as C's offsetof sees them)."""
    found = {}

    def fields_of(struct):
        names = []
        for decl in struct.decls or ():
            if decl.name is None and isinstance(decl.type, (c_ast.Struct, c_ast.Union)):
                names += fields_of(decl.type)
            else:
                names.append(decl.name)
        return names

    class Visitor(c_ast.NodeVisitor):
        def visit_Struct(self, node):
            if node.name and node.decls:
                found[node.name] = fields_of(node)
            self.generic_visit(node)

    Visitor().visit(ast)
    return found


def _ours(abi, name):
    layout = abi.layout(name)
    offsets = {}

    def walk(cls, base):
        for fname, ftype, *_ in cls._fields_:
            off = getattr(cls, fname).offset + base
            if fname in getattr(cls, "_anonymous_", ()):
                walk(ftype, off)
            else:
                offsets[fname] = off
    walk(layout, 0)
    return layout, offsets


def test_header_is_parsed(header_build):
    # The header must yield real content; an empty parse would make the other tests vacuous.
    assert header_build["minor"] >= 11
    assert len(header_build["sizes"]) >= 40
    assert len(header_build["requests"]) >= 35


def test_every_header_struct_matches(header_build):
    abi = k.KfdAbi(header_build["minor"])
    mismatches = []
    for name, size in header_build["sizes"].items():
        assert name in k.ALL_STRUCTS, f"header struct {name} missing from kfdtool.ioctls"
        layout, ours = _ours(abi, name)
        if ctypes.sizeof(layout) != size:
            mismatches.append(f"sizeof({name}): header {size}, ours {ctypes.sizeof(layout)}")
    for (name, field), offset in header_build["offsets"].items():
        _, ours = _ours(abi, name)
        renamed = {old: new for (s, new), (old, since) in k.FIELD_RENAMES.items()
                   if s == name and abi.minor < since}
        ours_name = renamed.get(field, field)
        if ours_name not in ours:
            mismatches.append(f"{name}.{field}: not in ours")
        elif ours[ours_name] != offset:
            mismatches.append(f"offsetof({name}, {field}): header {offset}, ours {ours[ours_name]}")
    assert not mismatches, "\n".join(mismatches)


def test_every_header_request_number_matches(header_build):
    abi = k.KfdAbi(header_build["minor"])
    for macro, value in header_build["requests"].items():
        name = macro.removeprefix("AMDKFD_IOC_")
        assert abi.supports(name), f"{macro} is in the {abi} header but not gated as supported"
        assert abi.request(name) == value, f"{macro}: header {value:#x}, ours {abi.request(name):#x}"
    # and nothing we claim for this version is missing from its header
    claimed = {i.macro for i in abi.supported_ioctls()}
    assert claimed == set(header_build["requests"])


def test_command_end_matches_header(header_build):
    text = HEADER.read_text()
    end = int(re.search(r"AMDKFD_COMMAND_END\s+(0x[0-9a-fA-F]+)", text).group(1), 16)
    assert k.KfdAbi(header_build["minor"]).command_end == end
