"""KV cache held the way engines hold it: a request -> token-slot table over a paged slot pool.

- `SlotTable` maps (request row, cache index) to a token slot. Slots come in pages of
  `page_size`; a request owns whole pages. Page 0 is reserved: slot 0 is the sink that padded
  lanes write to, and is never handed out.
- `KVBuffers` holds K and V per attention layer, indexed by token slot. The target and the draft
  head each have their own buffers over the same table, as engines share `req_to_token`.
- `StateBuffers` holds the recurrent state and conv window of each request row per recurrent
  layer, and a tracking slot per row.

The allocator lives on the host (as in engines); the table and buffers live on the device.
Table edits made by `reserve` / `shrink` are queued on the host and reach the device in one copy
(from pinned memory, asynchronous) when `flush` runs or `req_to_token` is read: a decode cycle
makes one host-to-device transfer for all its page changes, and no host sync.
"""

from __future__ import annotations

import torch

SINK_SLOT = 0


class CacheFullError(RuntimeError):
    """No free page or request row is left."""


class SlotTable:
    def __init__(self, *, max_requests: int, max_context: int, num_pages: int, page_size: int,
                 device: str | torch.device = "cpu"):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is reserved), got {num_pages}")
        self.page_size = page_size
        self.max_context = max_context
        self.num_pages = num_pages
        self.num_slots = num_pages * page_size
        self._table = torch.zeros((max_requests, max_context), dtype=torch.int64, device=device)
        self._pending: list[tuple[int, int, list[int]]] = []   # (row, first index, slots) not yet on the device
        self._free_pages = list(range(num_pages - 1, 0, -1))   # pop() hands out the lowest first
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self._pages: dict[int, list[int]] = {}                 # row -> pages it owns, in order

    @property
    def req_to_token(self) -> torch.Tensor:
        """[max_requests, max_context] int64 slot of each (row, cache index), queued edits applied."""
        self.flush()
        return self._table

    def flush(self) -> None:
        """Apply the queued table edits on the device: one transfer, no host sync. Edits of the
        same cell (a row released, then mapped for its next owner) keep the latest: the device
        copy gets each cell once, since a scatter with repeated indices keeps an arbitrary one."""
        if not self._pending:
            return
        latest: dict[int, int] = {}
        width = self.max_context
        # In the order they were made: a later edit of a cell replaces an earlier one.
        for row, first, slots in self._pending:
            latest.update(zip(range(row * width + first, row * width + first + len(slots)), slots))
        self._pending.clear()
        edits = torch.tensor([list(latest), list(latest.values())], dtype=torch.int64)
        if self._table.device.type == "cuda":
            edits = edits.pin_memory().to(self._table.device, non_blocking=True)
        self._table.view(-1).index_copy_(0, edits[0], edits[1])

    @property
    def num_free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def owners(self) -> dict[int, list[int]]:
        """Every allocated row and the pages it owns, in cache-index order (copies)."""
        return {row: list(pages) for row, pages in self._pages.items()}

    def free_page_ids(self) -> list[int]:
        """The pages in the free pool (a copy; the next one handed out last)."""
        return list(self._free_pages)

    def alloc_row(self) -> int:
        if not self._free_rows:
            raise CacheFullError("no free request row left in the slot table")
        row = self._free_rows.pop()
        self._pages[row] = []
        return row

    def capacity(self, row: int) -> int:
        return len(self._pages[row]) * self.page_size

    def reserve(self, row: int, length: int) -> None:
        """Make cache indices [0, length) of `row` point at owned slots."""
        if length > self.max_context:
            raise ValueError(f"length {length} exceeds max_context {self.max_context}")
        pages = self._pages[row]
        need = -(-length // self.page_size) - len(pages)
        if need > len(self._free_pages):
            raise CacheFullError(f"request row {row} needs {need} more pages, {len(self._free_pages)} are free")
        new = [self._free_pages.pop() for _ in range(max(need, 0))]
        if new:
            first = len(pages) * self.page_size
            slots = [p * self.page_size + i for p in new for i in range(self.page_size)]
            # The last page may stick out past max_context (page_size need not divide it): the
            # table has max_context columns, so only the slots of indices < max_context are mapped.
            self._pending.append((row, first, slots[:self.max_context - first]))
            pages.extend(new)

    def shrink(self, row: int, length: int) -> None:
        """Free every page of `row` past the one holding cache index `length - 1`."""
        pages = self._pages[row]
        keep = -(-length // self.page_size)
        freed = pages[keep:]
        if freed:
            del pages[keep:]
            first = keep * self.page_size
            count = min(len(freed) * self.page_size, self.max_context - first)
            self._pending.append((row, first, [SINK_SLOT] * count))
            self._free_pages.extend(reversed(freed))

    def free_row(self, row: int) -> None:
        self.shrink(row, 0)
        del self._pages[row]
        self._free_rows.append(row)


class KVBuffers:
    """Every layer's paged K and V: one tensor `[2L, slots, heads, head_dim]` (the L key layers,
    then the L value layers), so a commit moves the slots of all layers in one op
    (`ops.commit_accepted_kv`); `k` / `v` hold the per-layer views `[slots, heads, head_dim]` the attention reads."""

    def __init__(self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str | torch.device = "cpu"):
        self.stacked = torch.zeros((2 * num_layers, num_slots, num_kv_heads, head_dim), dtype=dtype, device=device)
        views = list(self.stacked.unbind(0))
        self.k, self.v = views[:num_layers], views[num_layers:]


class StateBuffers:
    """Each recurrent layer's state per request row: the recurrent state and the conv window.

    Two slots per request row: slot `row` holds the state after the request's cached tokens, slot
    `tracking_slot(row)` the tracked state (the state at the last multiple of the tracking
    interval, kept for prefix caching). One tensor per kind, `[L, slots, *shape]` (what a
    verify's commit scatters into); `state` / `conv` hold the per-layer views `[slots, *shape]`.
    """

    def __init__(self, *, num_layers: int, max_requests: int, state_shape: tuple[int, ...],
                 conv_shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cpu"):
        self.max_requests = max_requests
        slots = 2 * max_requests
        self.stacked = torch.zeros((num_layers, slots, *state_shape), dtype=dtype, device=device)
        self.conv_stacked = torch.zeros((num_layers, slots, *conv_shape), dtype=dtype, device=device)
        self.state = list(self.stacked.unbind(0))
        self.conv = list(self.conv_stacked.unbind(0))

    def tracking_slot(self, rows: torch.Tensor) -> torch.Tensor:
        return rows + self.max_requests

    def clear_tracking(self, rows: torch.Tensor) -> None:
        """Zero the tracking slots of `rows` [n] int64 (a new owner tracks nothing yet)."""
        for buf in (self.stacked, self.conv_stacked):
            buf[:, self.tracking_slot(rows)] = 0
