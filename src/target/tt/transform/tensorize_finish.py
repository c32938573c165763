"""After tt.Tensorize's walk: each push's wait and pop, the spilled tiles' physical CBs and the
compute inits (a mixin of ``_Tensorizer``)."""

from __future__ import annotations

from . import common
from .tensorize_records import VIRTUAL, _Event, _mode_key


class _AfterTheWalk:
    # ---- after the walk -----------------------------------------------------------------------
    def finish(self) -> dict | None:
        """Wait/pop per push and the init plan; the hoisted inits (None when the kernel stopped)."""
        if self.stopped:
            return None
        if self.out_format != self.format:
            # The packer stays configured for the outputs' format (compute_kernel_hw_startup's ocb); a tile
            # the kernel keeps in a CB of its own (the inputs' format) is packed between two reconfigs.
            outputs = [cb["id"] for cb in self.cbs if cb["role"] == "output"]
            for record in self.records:
                for op in record.ops:
                    if op["op"] == "pack" and op["cb"] not in outputs:
                        op["restore_format"] = outputs[0]
        for event, after in self.carry_events:  # a carried value nothing reads after its loop: popped unused
            if event.uses:
                continue
            last = next((r for r in reversed(self.records[after:]) if r.loops == event.loops), None)
            if last is None:
                raise common.UnsupportedTTOperationError(
                    f"kernel {self.name!r}: the value carried in CB {event.cb} is never read after its loop and no "
                    "statement follows the loop to drop it"
                )
            op = {"op": "discard", "cb": event.cb, "wait": [], "pop": []}
            last.ops.append(op)
            event.uses.append(op)
        by_cb: dict[int, list[_Event]] = {}
        for event in self.events:
            if not event.uses:
                continue
            event.uses[0]["wait"].append(event.cb)
            event.uses[-1]["pop"].append(event.cb)
            by_cb.setdefault(event.cb, []).append(event)
        all_ops = [op for record in self.records for op in record.ops]
        position = {id(op): k for k, op in enumerate(all_ops)}
        for cb, events in by_cb.items():
            for first, second in zip(events, events[1:], strict=False):
                if position[id(second.uses[0])] <= position[id(first.uses[-1])]:
                    raise common.UnsupportedTTOperationError(
                        f"kernel {self.name!r}: two tiles of CB {cb} are in use at once; use separate tile buffers"
                    )
        self._assign_spill_cbs(all_ops, position, by_cb)
        used = {op.get(k) for op in all_ops for k in ("cb", "in0", "in1", "scaler")}
        self.cbs[:] = [cb for cb in self.cbs if cb["role"] != "constant" or cb["id"] in used]  # e.g. a settled clear
        return self._plan_inits(all_ops)

    def _assign_spill_cbs(self, ops: list, position: dict, by_cb: dict) -> None:
        """Map the virtual ids of spilled tiles onto physical CBs: a CB is reused once the tile it held
        was popped (intervals from the pack to the last use, in program order). Free ids are the
        intermediate range from the first unused one, then unused ids below it, highest first."""
        virtual = sorted(cb for cb in {c["id"] for c in self.cbs} if cb >= VIRTUAL)
        if not virtual:
            return
        defined = {op["cb"]: k for k, op in enumerate(ops) if op["op"] == "pack" and op["cb"] >= VIRTUAL}
        ends = {
            cb: max((position[id(u)] for e in by_cb.get(cb, []) for u in e.uses), default=defined[cb]) for cb in virtual
        }
        taken = {c["id"] for c in self.cbs if c["id"] < VIRTUAL}
        limit = self.arch["num_cbs"]
        first = common.cb_ranges(limit)["intermediate"]
        pool = [i for i in range(first, limit) if i not in taken]
        pool += [i for i in range(first - 1, -1, -1) if i not in taken]
        busy: dict[int, int] = {}  # physical id -> position of its current tile's last use
        mapping: dict[int, int] = {}
        for cb in sorted(virtual, key=lambda c: defined[c]):
            free = next((i for i in pool if busy.get(i, -1) < defined[cb]), None)
            if free is None:
                raise common.UnsupportedTTOperationError(
                    f"kernel {self.name!r}: more tiles are live at once than the {limit} circular buffers of a core hold"
                )
            mapping[cb] = free
            busy[free] = ends[cb]
        for op in ops + [a["fpu"] for a in ops if a["op"] == "acquire" and a.get("fpu")]:
            for key in ("cb", "in0", "in1"):
                if op.get(key) in mapping:
                    op[key] = mapping[op[key]]
            for key in ("wait", "pop"):
                if key in op:
                    op[key] = [mapping.get(c, c) for c in op[key]]
        entries: dict[int, dict] = {}
        for entry in self.cbs:
            if entry["id"] >= VIRTUAL:
                physical = mapping.get(entry["id"])
                if physical is None or physical in entries:
                    continue
                entry = {**entry, "id": physical, "name": f"{entry['name']}{physical}"}
            entries[entry["id"]] = entry
        self.cbs[:] = list(entries.values())

    def _plan_inits(self, ops: list) -> dict:
        phases = [op for op in ops if op["op"] == "acquire"]
        modes = [op["fpu"] for op in phases]
        if any(m is None for m in modes):
            raise common.UnsupportedTTOperationError(f"kernel {self.name!r}: a DST phase without an FPU operation")
        first_pack = next((op["cb"] for op in ops if op["op"] == "pack"), None)
        hw = dict(modes[0]) if modes else None
        if hw is not None:
            hw["out"] = first_pack
        keys = [_mode_key(m) for m in modes]
        fpu_hoisted = bool(keys) and len(set(keys)) == 1
        for k, op in enumerate(phases):
            if not fpu_hoisted and keys[k] != keys[k - 1]:
                op["init"] = modes[k]  # the mode changes here (cyclically: the last phase precedes the first)
                # leaving a reduction: reduce_uninit clears the packer edge masks reduce_init set
                if modes[k - 1]["kind"] == "reduce" and modes[k]["kind"] != "reduce":
                    op["uninit"] = True
        current = None
        for op in ops:  # reduce_init names the CB its phase packs to (the packer's edge masks)
            if op["op"] == "acquire":
                current = op if op.get("init") and op["init"]["kind"] == "reduce" else None
            elif op["op"] == "pack" and current is not None:
                current["init"] = {**current["init"], "out": op["cb"]}
                current = None
        # Hoisted: the one mode, or the first phase's when that phase re-inits only from the second tile on.
        fpu = modes[0] if phases and (fpu_hoisted or phases[0]["init"] is None) else None
        sfpu = [op for op in ops if op["op"] == "sfpu"]
        fns = [op["fn"] for op in sfpu]
        if len(set(fns)) > 1:
            for k, op in enumerate(sfpu):
                op["init"] = fns[k] != fns[k - 1]
        sfpu_init = fns[0] if fns and (len(set(fns)) == 1 or not sfpu[0]["init"]) else None
        for op in phases:
            op.pop("zeroed", None)
            op.pop("fpu")
        return {"hw": hw, "fpu": fpu, "sfpu": sfpu_init}
