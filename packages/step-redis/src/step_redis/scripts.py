"""The Lua scripts step-redis runs on the server: each is atomic there, so each write is one unit.

Every key a script touches is passed in `KEYS` (a run's keys in `RunKeys` order); values are in
`ARGV`. A script makes its checks before its first write: Redis refuses a script's first write
when the server is out of memory and never stops one part way after it, so a script either
changes nothing or everything it was asked to.

Every time of a lease is the server's: a script reads `TIME` (whole microseconds since the Unix
epoch) and never takes a time from the client. A script that writes after reading it relies on
effects replication (what is replicated and logged is the writes, not the script), the only mode
since Redis 7 and the default since Redis 5; on older servers the scripts switch it on.
"""

from __future__ import annotations

from typing import Final

from .keys import RunKeys

__all__ = (
    'COMMIT',
    'DELETE_RUN',
    'GET_LEASE',
    'GET_NODES',
    'INSERT_RUN',
    'LEASE_FIELDS',
    'LIST_LEASES',
    'LIST_RUNS',
    'LIST_SNAPSHOTS',
    'RUN_KEY_COUNT',
    'SWAP_LEASE',
)

RUN_KEY_COUNT: Final = len(RunKeys._fields)

_RUN_KEYS = '\n'.join(f'local {name.upper()} = {n}' for n, name in enumerate(RunKeys._fields, start=1))

_HMGET = """
-- HMGET in slices: Lua's unpack() takes a bounded number of values.
local function hmget(key, fields)
  local found = {}
  for first = 1, #fields, 1000 do
    local slice = {}
    for i = first, math.min(first + 999, #fields) do slice[#slice + 1] = fields[i] end
    local values = redis.call('HMGET', key, unpack(slice))
    for i = 1, #values do found[#found + 1] = values[i] end
  end
  return found
end
"""

LEASE_FIELDS: Final = ('epoch', 'state', 'host', 'expires', 'body')
"""The fields of a lease hash, in the order the scripts answer them."""

_NOW = """
-- The server's clock, in whole microseconds since the Unix epoch (exact in a Lua number until 2255).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function us(n) return string.format('%.0f', n) end
"""

_LEASE = (
    'local LEASE_FIELDS = {'
    + ', '.join(f"'{name}'" for name in LEASE_FIELDS)
    + '}\n'
    + """
-- A lease's fields in LEASE_FIELDS order (false for a missing one), or nil when there is no lease.
local function read_lease(lease)
  if redis.call('EXISTS', lease) == 0 then return nil end
  return redis.call('HMGET', lease, unpack(LEASE_FIELDS))
end
"""
)

COMMIT: Final = (
    f'local N = {RUN_KEY_COUNT}\n'
    + _RUN_KEYS
    + """
-- One batch of writes. KEYS: the keys of each run of the batch, N per run. ARGV: operations,
-- each a tag, the index of its run (0-based), then its fields:
--   L epoch                                                          the fence: the run's lease has this epoch
--   S key parent state complete row count (node-id node-row)*count   a snapshot and its new nodes
--   D count seq*count                                                snapshots to delete
--   F tool-call-id row                                               a ledger entry (upsert)
--   E key row                                                        an event (skipped if its key is applied)
--   W id keep                                                        the write's id, kept `keep` seconds
-- An empty key or parent stands for none. A write whose id its run's WRITES holds was applied
-- already (its answer was lost on the way: a timeout, a dropped connection) and answers 'ok' again
-- without writing; an applied write adds its id there and drops the ids older than `keep` seconds.
-- Answers 'ok', or, without writing anything:
-- 'fenced:<run index>' (that run's lease epoch is not the one the writer holds, or it has no
-- lease), 'conflict' (the snapshot's key is applied already) or 'stale' (its parent node is gone).
local function key(op, slot) return KEYS[op.run * N + slot] end
local ops = {}
local i = 1
while i <= #ARGV do
  local op = {tag = ARGV[i], run = tonumber(ARGV[i + 1]), at = i + 2}
  if op.tag == 'S' then
    op.count = tonumber(ARGV[i + 7])
    i = i + 8 + 2 * op.count
  elseif op.tag == 'D' then
    op.count = tonumber(ARGV[i + 2])
    i = i + 3 + op.count
  elseif op.tag == 'F' or op.tag == 'E' then
    i = i + 4
  elseif op.tag == 'L' then
    i = i + 3
  elseif op.tag == 'W' then
    i = i + 4
  else
    return redis.error_reply('step-redis commit: unknown operation ' .. tostring(op.tag))
  end
  ops[#ops + 1] = op
end
for _, op in ipairs(ops) do
  if op.tag == 'W' and redis.call('ZSCORE', key(op, WRITES), ARGV[op.at]) then return 'ok' end
end
for _, op in ipairs(ops) do
  if op.tag == 'L' and redis.call('HGET', key(op, LEASE), 'epoch') ~= ARGV[op.at] then
    return 'fenced:' .. op.run
  end
end
for _, op in ipairs(ops) do
  if op.tag == 'S' then
    local snapshot_key, parent = ARGV[op.at], ARGV[op.at + 1]
    if snapshot_key ~= '' and redis.call('SISMEMBER', key(op, SNAPKEYS), snapshot_key) == 1 then
      return 'conflict'
    end
    if parent ~= '' and redis.call('HEXISTS', key(op, NODE), parent) == 0 then return 'stale' end
  end
end
for _, op in ipairs(ops) do
  local a = op.at
  if op.tag == 'S' then
    local nodes = a + 6
    for first = 0, op.count - 1, 500 do
      local fields = {}
      for n = first, math.min(first + 499, op.count - 1) do
        fields[#fields + 1] = ARGV[nodes + 2 * n]
        fields[#fields + 1] = ARGV[nodes + 2 * n + 1]
      end
      redis.call('HSET', key(op, NODE), unpack(fields))
    end
    local seq = redis.call('INCR', key(op, SNAPCOUNT))
    redis.call('HSET', key(op, SNAP), seq, ARGV[a + 4])
    redis.call('HSET', key(op, SNAPSTATE), seq, ARGV[a + 2])
    redis.call('ZADD', key(op, SNAPSEQ), seq, seq)
    if ARGV[a + 3] == '1' then redis.call('ZADD', key(op, SNAPDONE), seq, seq) end
    if ARGV[a] ~= '' then redis.call('SADD', key(op, SNAPKEYS), ARGV[a]) end
  elseif op.tag == 'D' then
    for n = 1, op.count do
      local seq = ARGV[a + n]
      redis.call('HDEL', key(op, SNAP), seq)
      redis.call('HDEL', key(op, SNAPSTATE), seq)
      redis.call('ZREM', key(op, SNAPSEQ), seq)
      redis.call('ZREM', key(op, SNAPDONE), seq)
    end
  elseif op.tag == 'F' then
    if redis.call('HSET', key(op, FX), ARGV[a], ARGV[a + 1]) == 1 then
      redis.call('RPUSH', key(op, FXORDER), ARGV[a])
    end
  elseif op.tag == 'E' then
    if ARGV[a] == '' or redis.call('SADD', key(op, EVKEYS), ARGV[a]) == 1 then
      redis.call('RPUSH', key(op, EV), ARGV[a + 1])
    end
  elseif op.tag == 'W' then
    local now = tonumber(redis.call('TIME')[1])
    redis.call('ZREMRANGEBYSCORE', key(op, WRITES), '-inf', now - tonumber(ARGV[a + 1]))
    redis.call('ZADD', key(op, WRITES), now, ARGV[a])
  end
end
return 'ok'
"""
)

INSERT_RUN: Final = """
-- KEYS: runs, runorder, runseq, conversation index, parent index. ARGV: run id, row, whether the
-- run has a conversation id, a parent run id ('1' or ''). Answers nothing when inserted, else
-- the existing row.
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return redis.call('HGET', KEYS[1], ARGV[1])
end
local order = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], order, ARGV[1])
if ARGV[3] == '1' then redis.call('ZADD', KEYS[4], order, ARGV[1]) end
if ARGV[4] == '1' then redis.call('ZADD', KEYS[5], order, ARGV[1]) end
return false
"""

LIST_RUNS: Final = (
    _HMGET
    + """
-- KEYS: an index of run ids (sorted set), runs. Answers id, row, id, row, ... in index order.
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local rows = hmget(KEYS[2], ids)
local found = {}
for i = 1, #ids do
  if rows[i] then
    found[#found + 1] = ids[i]
    found[#found + 1] = rows[i]
  end
end
return found
"""
)

DELETE_RUN: Final = (
    f'local N = {RUN_KEY_COUNT}\n'
    + """
-- KEYS: runs, runorder, conversation index, parent index, then the run's own keys (N, its lease
-- and start point among them), then the lease index of every live state.
-- ARGV: run id, the run row read before ('' for none). Answers -1 when the row changed meanwhile
-- (nothing is deleted), else how many keys and entries were removed.
local row = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if row ~= ARGV[2] then return -1 end
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
for i = 2, 4 do removed = removed + redis.call('ZREM', KEYS[i], ARGV[1]) end
for i = 5, 4 + N do removed = removed + redis.call('DEL', KEYS[i]) end
for i = 5 + N, #KEYS do removed = removed + redis.call('ZREM', KEYS[i], ARGV[1]) end
return removed
"""
)

LIST_SNAPSHOTS: Final = (
    _HMGET
    + """
-- KEYS: an index of seqs (snapseq or snapdone), snap, snapstate. ARGV: '1' for the newest only.
-- Answers seq, state, row, seq, state, row, ... oldest first.
local seqs
if ARGV[1] == '1' then
  seqs = redis.call('ZREVRANGE', KEYS[1], 0, 0)
else
  seqs = redis.call('ZRANGE', KEYS[1], 0, -1)
end
local rows = hmget(KEYS[2], seqs)
local states = hmget(KEYS[3], seqs)
local found = {}
for i = 1, #seqs do
  if rows[i] then
    found[#found + 1] = seqs[i]
    found[#found + 1] = states[i] or ''
    found[#found + 1] = rows[i]
  end
end
return found
"""
)

GET_NODES: Final = """
-- KEYS: node. ARGV: head, length, head, length, ... Answers id, row, id, row, ... for every node
-- on the chains (each once). A chain ends early at a missing node or a row without a parent field.
local found, walked = {}, {}
for c = 1, #ARGV, 2 do
  local node, left = ARGV[c], tonumber(ARGV[c + 1])
  while node ~= '' and left > 0 do
    local seen = walked[node]
    if seen and seen.left >= left then break end
    local row = seen and seen.row or redis.call('HGET', KEYS[1], node)
    if not row then break end
    if not seen then
      found[#found + 1] = node
      found[#found + 1] = row
    end
    walked[node] = {left = left, row = row}
    local cut = string.find(row, '\\0', 1, true)
    if not cut then break end
    node = string.sub(row, 1, cut - 1)
    left = left - 1
  end
end
return found
"""

GET_LEASE: Final = (
    _NOW
    + _LEASE
    + """
-- KEYS: lease. Answers the server's now, then the lease's fields (LEASE_FIELDS) when there is one.
local found = {us(now_us())}
local lease = read_lease(KEYS[1])
if lease then
  for i = 1, #LEASE_FIELDS do found[#found + 1] = lease[i] end
end
return found
"""
)

SWAP_LEASE: Final = (
    _NOW
    + _LEASE
    + """
-- Compare and set a run's lease (stepcore.backend.ops.SwapLease) on the server's clock.
-- KEYS: lease, start point, then the index of every live state. ARGV: run id, the expected epoch
-- ('' for no lease), '1' to match only an expired lease, then the new lease's epoch, state, host,
-- time to live (whole microseconds) and body, the position among the indexes of the one its state
-- goes in (0 for none: 'ended'), '1' to store the start point and the start point, then the expiry
-- the lease must still have (whole microseconds; '' for any).
-- It matches when the run has no lease and none is expected, or when the lease's epoch is the one
-- expected and, with '1', its expiry is before now (and is the one given, if any). Then it stores
-- the lease with expires = now + time to live, and files the run under its state's index (scored by
-- expires) and no other.
-- Answers '1' (stored) or '0', the server's now, then the lease as it is after (LEASE_FIELDS) when
-- the run has one.
if redis.replicate_commands then redis.replicate_commands() end
local now = now_us()
local current = read_lease(KEYS[1])
local matched
if current == nil or ARGV[2] == '' then
  matched = current == nil and ARGV[2] == ''
else
  local expires = tonumber(current[4])
  matched = current[1] == ARGV[2] and (ARGV[3] ~= '1' or (expires ~= nil and expires < now))
    and (ARGV[12] == '' or current[4] == ARGV[12])
end
local found = {matched and '1' or '0', us(now)}
if not matched then
  if current then
    for i = 1, #LEASE_FIELDS do found[#found + 1] = current[i] end
  end
  return found
end
local expires = us(now + tonumber(ARGV[7]))
local lease = {ARGV[4], ARGV[5], ARGV[6], expires, ARGV[8]}
local fields = {}
for i = 1, #LEASE_FIELDS do
  fields[#fields + 1] = LEASE_FIELDS[i]
  fields[#fields + 1] = lease[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[10] == '1' then redis.call('SET', KEYS[2], ARGV[11]) end
local slot = tonumber(ARGV[9])
for i = 3, #KEYS do
  if i - 2 == slot then
    redis.call('ZADD', KEYS[i], expires, ARGV[1])
  else
    redis.call('ZREM', KEYS[i], ARGV[1])
  end
end
for i = 1, #lease do found[#found + 1] = lease[i] end
return found
"""
)

LIST_LEASES: Final = (
    _NOW
    + _LEASE
    + """
-- KEYS: leases (of runs read from the state indexes). ARGV: the states wanted.
-- Answers the server's now, then for every lease still there and in one of the states: its
-- position among KEYS and its fields (LEASE_FIELDS).
local wanted = {}
for i = 1, #ARGV do wanted[ARGV[i]] = true end
local found = {us(now_us())}
for k = 1, #KEYS do
  local lease = read_lease(KEYS[k])
  if lease and lease[2] and wanted[lease[2]] then
    found[#found + 1] = k
    for i = 1, #LEASE_FIELDS do found[#found + 1] = lease[i] end
  end
end
return found
"""
)
