"""What a page's python blocks bind and use: the static half of "pasted in order, and alone".

A page's python blocks share one interpreter (:mod:`tests.docsession`), like a notebook. Two
ways to paste it go wrong without an error:

- **In order.** A block rebinds a name an earlier block bound (``orders`` read again from an
  empty folder) and a later block, written against the first binding, goes on with the new
  one: it runs, and silently writes nothing. :func:`rebinding_problems` refuses any block
  that rebinds, by assignment, a name that an earlier block bound *and* a later block uses.
- **Alone.** A reader who jumps to a section pastes that block after the page's setup
  (the blocks marked ``<!-- setup -->``): every name the block uses without binding it must
  come from a setup block above it (or be a builtin). :func:`alone_problems` names the others.

Names are read with :mod:`symtable`: what the module scope assigns or imports, and what any
scope of the block reads as a global. Blocks written to a file (``# job.py``), skipped or
not compiling are left out (the run reports those).
"""

from __future__ import annotations

import builtins
import symtable
from dataclasses import dataclass

from tests.docblocks import Block, Page

_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Names:
    """One block's top-level names."""

    assigned: frozenset[str]  # bound by assignment, def, class, for, with ... as
    imported: frozenset[str]
    used: frozenset[str]  # read (in any scope of the block) as a module-level name

    @property
    def bound(self) -> frozenset[str]:
        return self.assigned | self.imported

    @property
    def free(self) -> frozenset[str]:
        """Used and not bound by the block itself, nor a builtin: what it needs from above."""
        return self.used - self.bound - _BUILTINS


def _globals_read(table: symtable.SymbolTable) -> set[str]:
    found: set[str] = set()
    for child in table.get_children():
        for sym in child.get_symbols():
            if sym.is_referenced() and sym.is_global():
                found.add(sym.get_name())
        found |= _globals_read(child)
    return found


def names(block: Block) -> Names | None:
    """The block's names, or None when it does not compile (the run says why)."""
    try:
        table = symtable.symtable(block.text, block.name, "exec")
    except SyntaxError:
        return None
    assigned, imported, used = set(), set(), _globals_read(table)
    for sym in table.get_symbols():
        if sym.is_imported():
            imported.add(sym.get_name())
        elif sym.is_assigned() or sym.is_namespace():
            assigned.add(sym.get_name())
        if sym.is_referenced():
            used.add(sym.get_name())
    return Names(frozenset(assigned), frozenset(imported), frozenset(used))


def python_blocks(page: Page) -> list[tuple[Block, Names]]:
    """The page's interpreter blocks, in order, with their names (every one a reader pastes:
    slow ones too, whether or not this run runs them)."""
    found = []
    for block in page.blocks:
        if block.kind != "python" or block.file or block.skip is not None:
            continue
        if (n := names(block)) is not None:
            found.append((block, n))
    return found


def rebinding_problems(page: Page) -> list[str]:
    """Blocks that reassign a name an earlier block bound while a later block still uses it."""
    blocks = python_blocks(page)
    problems = []
    for j, (block, n) in enumerate(blocks):
        earlier = {name: b for b, m in blocks[:j] for name in m.bound}
        for name in sorted(n.assigned & earlier.keys()):
            users = [b.name for b, m in blocks[j + 1 :] if name in m.free]
            if users:
                problems.append(
                    f"{block.name} rebinds {name!r} (bound at {earlier[name].name}), which "
                    f"{', '.join(users)} use{'s' if len(users) == 1 else ''} after it: pasted "
                    f"in order, they run on the new value; give {block.name} a name of its own"
                )
    return problems


def alone_problems(page: Page) -> list[str]:
    """Blocks that use a name no setup block above them (nor they themselves) binds."""
    problems = []
    setup: set[str] = set()
    for block, n in python_blocks(page):
        missing = sorted(n.free - setup)
        if missing:
            problems.append(
                f"{block.name} uses {', '.join(map(repr, missing))}, bound by no block above it "
                "marked <!-- setup -->: pasted alone, it fails; mark the block that binds "
                "it as setup, or bind it here"
            )
        if block.setup:
            setup |= n.bound
    return problems
