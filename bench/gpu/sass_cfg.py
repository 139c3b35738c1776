"""Control flow and loops of the kernels in an `nvdisasm -c -gi` listing.

Parses the listing into functions (instructions with their source line tags),
splits them into basic blocks, finds the natural loops (back edges to a
dominating header) and measures a loop:
  static  every instruction of the loop, its out-of-line blocks included;
  path    the longest path from the header to a back edge through the loop's
          in-line blocks (those between the header and its last back edge),
          leaving out the blocks that call a slow-path subroutine (IEEE
          division / square root when FCHK fails) and the out-of-line blocks
          (non-converged shuffles, slow paths); an inner loop counts 0 there
          and is measured as a loop of its own. For a warp that takes no slow
          path this is the number of warp instructions it issues per
          iteration, the longer side of every branch taken.
"""
import collections
import re

_INS = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;\s*$")
_SEC = re.compile(r"^\.text\.(\S+):$")
_LAB = re.compile(r"^([^\s/][^\s]*):$")
_TAG = re.compile(r'//## File "([^"]+)", line (\d+)')
_TARGET = re.compile(r"`\(([^)]+)\)")
_PRED = re.compile(r"^@(!?)(U?P\w+)\s+")

class Ins:
    __slots__ = ("addr", "text", "pred", "op", "tag")

    def __init__(self, addr, text, tag):
        self.addr, self.tag = addr, tag
        m = _PRED.match(text)
        self.pred = None
        if m:
            self.pred = m.group(1) + m.group(2)
            text = text[m.end():]
        self.text = text
        self.op = text.split()[0] if text else ""

    @property
    def base(self):
        return self.op.split(".")[0]


class Function:
    def __init__(self, name):
        self.name, self.ins, self.labels = name, [], {}

    def counted(self):
        """Instructions without the trailing alignment padding (NOP, BRA to itself)."""
        return [i for i in self.ins if i.base != "NOP" and not (i.base == "BRA" and self._target(i) == i.addr)]

    def _target(self, i):
        m = _TARGET.search(i.text)
        return self.labels.get(m.group(1)) if m else None


def parse(text):
    """{mangled name: Function} of every .text section of the listing. An
    instruction's tag is its inline stack, innermost first: ((file, line), ...)."""
    funcs, cur, tag, pending, in_tag = collections.OrderedDict(), None, None, [], False
    for line in text.splitlines():
        m = _SEC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), Function(m.group(1)))
            tag, pending, in_tag = None, [], False
            continue
        if cur is None:
            continue
        m = _TAG.search(line)
        if m:
            frame = ((m.group(1), int(m.group(2))),)
            tag = tag + frame if in_tag and tag else frame
            in_tag = True
            continue
        in_tag = False
        m = _INS.match(line)
        if m:
            a = int(m.group(1), 16)
            for p in pending:
                cur.labels[p] = a
            pending = []
            cur.ins.append(Ins(a, m.group(2), tag))
            continue
        m = _LAB.match(line.strip())
        if m:
            pending.append(m.group(1))
    return funcs


class Block:
    __slots__ = ("id", "ins", "succ", "pred")

    def __init__(self, bid):
        self.id, self.ins, self.succ, self.pred = bid, [], [], []

    @property
    def start(self):
        return self.ins[0].addr

    @property
    def end(self):
        return self.ins[-1].addr


_ENDS = {"BRA", "EXIT", "RET", "BRX", "JMX", "JMP", "WARPSYNC"}


class Cfg:
    def __init__(self, fn):
        self.fn = fn
        ins = fn.ins
        leaders = {ins[0].addr} | set(fn.labels.values())
        for k, i in enumerate(ins[:-1]):
            if i.base in _ENDS:
                leaders.add(ins[k + 1].addr)
        self.blocks, at = [], {}
        for i in ins:
            if i.addr in leaders:
                self.blocks.append(Block(len(self.blocks)))
                at[i.addr] = self.blocks[-1]
            self.blocks[-1].ins.append(i)
        for k, b in enumerate(self.blocks):
            last = b.ins[-1]
            nxt = self.blocks[k + 1] if k + 1 < len(self.blocks) else None
            # BRA.DIV (taken when the warp has diverged) and BRA.CONV are conditional without a predicate.
            uncond = last.pred in (None, "PT") and not re.match(r"BRA\.(DIV|CONV)", last.op)
            tgt = fn._target(last)
            if last.base in ("BRA", "JMP") or (last.base == "WARPSYNC" and tgt is not None):
                if last.pred != "!PT" and tgt in at:
                    b.succ.append(at[tgt])
                if (not uncond or last.base == "WARPSYNC") and nxt:
                    b.succ.append(nxt)
            elif last.base in ("EXIT", "RET", "BRX", "JMX"):
                # BRX/JMX (indirect jumps) do not occur in these kernels; their targets are unknown here.
                if not uncond and nxt:
                    b.succ.append(nxt)
            elif nxt:
                b.succ.append(nxt)
            for s in b.succ:
                s.pred.append(b)
        self._dominators()
        self.loops = self._loops()

    def _dominators(self):
        """Cooper, Harvey and Kennedy's iterative immediate dominators over the blocks reachable from entry."""
        order, seen, stack = [], {0}, [(self.blocks[0], iter(self.blocks[0].succ))]
        while stack:
            b, it = stack[-1]
            for s in it:
                if s.id not in seen:
                    seen.add(s.id)
                    stack.append((s, iter(s.succ)))
                    break
            else:
                order.append(b)
                stack.pop()
        rpo = order[::-1]
        num = {b.id: k for k, b in enumerate(rpo)}
        idom = {rpo[0].id: rpo[0].id}
        changed = True
        while changed:
            changed = False
            for b in rpo[1:]:
                ps = [p.id for p in b.pred if p.id in idom]
                new = ps[0]
                for p in ps[1:]:
                    a, c = p, new
                    while a != c:
                        while num[a] > num[c]:
                            a = idom[a]
                        while num[c] > num[a]:
                            c = idom[c]
                    new = a
                if idom.get(b.id) != new:
                    idom[b.id], changed = new, True
        self.idom, self.reachable = idom, num

    def dominates(self, h, b):
        while True:
            if b == h:
                return True
            up = self.idom.get(b)
            if up is None or up == b:
                return False
            b = up

    def _loops(self):
        by_head = collections.OrderedDict()
        for b in self.blocks:
            if b.id not in self.reachable:
                continue
            for s in b.succ:
                if self.dominates(s.id, b.id):
                    by_head.setdefault(s.id, []).append(b)
        loops = []
        for h, latches in sorted(by_head.items(), key=lambda kv: self.blocks[kv[0]].start):
            body, work = {h}, [l.id for l in latches]
            while work:
                x = work.pop()
                if x not in body:
                    body.add(x)
                    work.extend(p.id for p in self.blocks[x].pred)
            loops.append(Loop(self, h, [l.id for l in latches], body))
        for lp in loops:
            lp.inner = [o for o in loops if o is not lp and o.head in lp.body and o.body < lp.body]
        return loops


class Loop:
    def __init__(self, cfg, head, latches, body):
        self.cfg, self.head, self.latches, self.body = cfg, head, latches, body
        B = cfg.blocks
        self.first = B[head].start
        self.last = max(B[l].end for l in latches)

    def instructions(self):
        return [i for b in sorted(self.body) for i in self.cfg.blocks[b].ins]

    def static(self):
        return sum(len(self.cfg.blocks[b].ins) for b in self.body)

    def inline(self, b):
        return self.first <= self.cfg.blocks[b].start <= self.last

    def hot_path(self, skips=()):
        """(count, instructions on the path, dropped skips); see the module comment.

        `skips`: predicates on an instruction; a block with an instruction that
        one of them accepts is left out (code of a runtime branch that the
        configuration measured does not take), unless that cuts the header off
        every back edge: such a skip is dropped and returned."""
        B = self.cfg.blocks
        direct = [o for o in self.inner if not any(o.body < x.body for x in self.inner)]
        rep = {}
        for o in direct:
            for b in o.body:
                rep[b] = ("loop", o.head)

        def node(b):
            return rep.get(b, ("block", b))

        cold = {b for b in self.body if b not in rep and
                (not self.inline(b) or any(i.base == "CALL" for i in B[b].ins))}
        if self._path(node, cold) is None:
            cold = set()  # no way around the slow paths: count them
        dropped = []
        for k, sk in enumerate(skips):
            out = cold | {b for b in self.body if b not in rep and any(sk(i) for i in B[b].ins)}
            if self._path(node, out) is None:
                dropped.append(k)
            else:
                cold = out
        count, path = self._path(node, cold)
        ins = [i for kind, b in path if kind == "block" for i in B[b].ins]
        return count, ins, dropped

    def _path(self, node, out):
        B = self.cfg.blocks
        nodes = {node(b) for b in self.body if b not in out}
        succ = collections.defaultdict(set)
        for b in self.body:
            if b in out:
                continue
            for s in B[b].succ:
                if s.id in self.body and s.id != self.head and s.id not in out and node(s.id) != node(b):
                    succ[node(b)].add(node(s.id))
        ends = {node(l) for l in self.latches if l not in out} & nodes
        return self._longest(("block", self.head), succ, ends)

    def _longest(self, start, succ, ends):
        B = self.cfg.blocks
        order, seen, stack = [], {start}, [(start, iter(sorted(succ[start])))]
        while stack:
            n, it = stack[-1]
            for s in it:
                if s not in seen:
                    seen.add(s)
                    stack.append((s, iter(sorted(succ[s]))))
                    break
            else:
                order.append(n)
                stack.pop()
        weight = lambda n: len(B[n[1]].ins) if n[0] == "block" else 0
        dist, prev = {start: weight(start)}, {}
        for n in reversed(order):
            if n not in dist:
                continue
            for s in succ[n]:
                d = dist[n] + weight(s)
                if d > dist.get(s, -1):
                    dist[s], prev[s] = d, n
        reached = [e for e in ends if e in dist]
        if not reached:
            return None
        e = max(reached, key=lambda n: dist[n])
        path = [e]
        while path[-1] != start:
            path.append(prev[path[-1]])
        return dist[e], path[::-1]


# Opcode classes of the breakdown, by base opcode (IMAD.MOV and friends are moves).
CLASSES = [
    ("FFMA/FMUL/FADD", {"FFMA", "FMUL", "FADD", "FFMA32I", "FMUL32I", "FADD32I"}),
    ("FP cmp/sel/mnmx", {"FSETP", "FSET", "FSEL", "FMNMX", "FCHK"}),
    ("FP64", {"DADD", "DMUL", "DFMA", "DSETP", "DMNMX"}),
    ("MUFU", {"MUFU"}),
    ("conversion", {"F2F", "F2I", "I2F", "F2FP", "I2FP", "F2IP", "FRND"}),
    ("integer", {"IMAD", "IADD3", "LOP3", "SHF", "LEA", "ISETP", "IMNMX", "VIMNMX", "IABS", "SEL", "PRMT", "BFE",
                 "BFI", "POPC", "FLO", "IMUL", "VIADD", "IADD", "LOP", "SHL", "SHR", "PLOP3", "P2R", "R2P", "BMSK",
                 "BREV", "IDP", "IMNMX3", "VIADDMNMX", "I2IP"}),
    ("move", {"MOV", "MOV32I"}),
    ("uniform", None),
    ("LDG/STG", {"LDG", "STG", "LD", "ST", "RED", "ATOM", "ATOMG", "REDG"}),
    ("LDS/STS", {"LDS", "STS", "ATOMS", "LDSM"}),
    ("LDL/STL", {"LDL", "STL"}),
    ("LDC", {"LDC"}),
    ("SHFL", {"SHFL", "VOTE", "MATCH", "REDUX"}),
    ("branch/sync", {"BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "WARPSYNC", "BAR", "BREAK", "ENDCOLLECTIVE",
                     "YIELD", "NANOSLEEP"}),
]


def op_class(i):
    if i.op.startswith("IMAD.MOV"):
        return "move"
    if i.base.startswith("U") or i.base in ("R2UR", "S2UR"):
        return "uniform"
    for name, ops in CLASSES:
        if ops and i.base in ops:
            return name
    return "other"


def breakdown(ins):
    c = collections.Counter(op_class(i) for i in ins)
    return [(name, c[name]) for name, _ in CLASSES + [("other", None)] if c[name]]
