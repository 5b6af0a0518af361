"""A Redis store's kernel files (`RedisStore.kernel_files`): one hash per key, `PREFIX:kernel:KEY`, each
file a field holding its bytes in base64, signed and bounded as `store.kernel_entries` says.

`READ` is one script: it checks the hash's length, each name and each value's length (`HSTRLEN`) on
the server and sends only what is within the bounds, so a planted 400 MB field is never sent.

Example:
    >>> b64_chars(3), b64_chars(4)
    (4, 8)
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any

from . import kernel_entries as bounds
from .kernel_entries import signed, skip, verified

__all__ = ["READ", "read", "write", "b64_chars"]

log = logging.getLogger("gemmtune")

# KEYS: the kernel's hash.  ARGV: most entries, longest name, longest value, longest values together
# (base64 characters).  Returns {entries, 'ok', left out, name, value, ...}, or {entries, 'many'|'big', 0}.
READ = """
local n = redis.call('HLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return {n, 'many', 0} end
local out, total, left = {n, 'ok', 0}, 0, 0
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  local size = redis.call('HSTRLEN', KEYS[1], name)
  if #name > tonumber(ARGV[2]) or string.find(name, '[^%w%._%+%-]') or size > tonumber(ARGV[3]) then
    left = left + 1
  else
    total = total + size
    if total > tonumber(ARGV[4]) then return {n, 'big', 0} end
    local value = redis.call('HGET', KEYS[1], name)
    if string.find(value, '[^%w%+/=]') then
      left = left + 1
    else
      table.insert(out, name)
      table.insert(out, value)
    end
  end
end
out[3] = left
return out
"""


def b64_chars(n: int) -> int:
    """The length of `n` bytes in base64."""
    return 4 * ((n + 2) // 3)


def read(client: Any, hashkey: str, where: str, key: str) -> tuple[dict[str, bytes], bool]:
    """(the entries under `hashkey` within the bounds, whether none was left out).

    Example:
        >>> import redis                                                              # doctest: +SKIP
        >>> client = redis.Redis(port=6379, decode_responses=True)                    # doctest: +SKIP
        >>> write(client, "gemmtune:kernel:K", "K", {"k.cubin": b"..."}, None, "redis") # doctest: +SKIP
        >>> read(client, "gemmtune:kernel:K", "redis", "K")                           # doctest: +SKIP
        ({'k.cubin': b'...'}, True)
    """
    most = bounds.MAX_FILE_BYTES
    got = client.register_script(READ)(keys=[hashkey], args=[bounds.MAX_ENTRIES, bounds.MAX_NAME_CHARS, b64_chars(most),
                                                             b64_chars(bounds.MAX_KERNEL_BYTES)])
    count, status, left, flat = int(got[0]), got[1], int(got[2]), got[3:]
    if status != "ok":
        skip(where, key, "oversized", f"more than {bounds.MAX_ENTRIES} entries" if status == "many" else
             f"its entries weigh more than {bounds.MAX_KERNEL_BYTES} bytes together")
        return {}, False
    entries = {}
    for name, value in zip(flat[::2], flat[1::2]):
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            data = None
        if data is None or len(data) > most:  # base64 rounds up: a few bytes over pass the server's check
            left += 1
        else:
            entries[name] = data
    if left:
        skip(where, key, "oversized", f"{left} of {count} entries over {most} bytes, not base64, "
                                      "or not named as a file")
    return entries, left == 0


def write(client: Any, hashkey: str, key: str, files: dict[str, bytes], signer: Any, where: str) -> None:
    """Keep `files` under `hashkey`.  Without a signer a file already there stays (the first writer wins);
    with one, the files there that verify stay, and the hash is written again without the others (an
    unsigned or planted entry never blocks a signed one).  A race with another writer: tried again.

    Example: see `read`.
    """
    if signer is None:
        pipe = client.pipeline(transaction=False)
        for name, data in files.items():
            pipe.hsetnx(hashkey, name, base64.b64encode(data).decode())
        pipe.execute()
        return
    import redis

    for _ in range(3):
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(hashkey)
                entries, complete = read(pipe, hashkey, where, key)
                kept = verified(signer, key, entries, where, quiet=True)
                fresh = {name: data for name, data in files.items() if name not in kept}
                clean = complete and len(entries) == 2 * len(kept)
                if not fresh and clean:
                    return
                pipe.multi()
                if not clean:
                    pipe.delete(hashkey)
                mapping = signed(signer, key, fresh if clean else {**kept, **fresh})
                pipe.hset(hashkey, mapping={n: base64.b64encode(d).decode() for n, d in mapping.items()})
                pipe.execute()
                return
            except redis.WatchError:
                continue
    log.info("gemmtune: store %s: kernel files under %s not kept: other writers kept changing them", where, key)
