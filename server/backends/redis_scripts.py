"""The Lua scripts of the Redis backend: each runs atomically on one document's
keys (or the lease set), so seq, fan-out and run ownership need no locks."""



def _init(meta: str, log: str, fresh: str) -> str:
    """The document's epoch (`epoch`), the log started under `fresh` if it has none."""
    return f"""
local epoch = redis.call('HGET', {meta}, 'epoch')
if not epoch then
  epoch = {fresh}
  redis.call('DEL', {log})
  redis.call('HSET', {meta}, 'epoch', epoch, 'last_seq', 0)
end
"""


def _append(body: str, kind: str, ts: str, maxlen: str, channel: str,
            meta: str = "KEYS[1]", log: str = "KEYS[2]") -> str:
    """One event: its seq (`seq`), its frame (`frame`) in the log, published live as
    `epoch seq type frame` (redis_fanout.py reads that)."""
    return f"""
local seq = redis.call('HINCRBY', {meta}, 'last_seq', 1)
local frame = {body} .. ',"seq":' .. seq .. ',"ts":' .. {ts} .. '}}'
redis.call('XADD', {log}, 'MAXLEN', '~', {maxlen}, seq .. '-1', 't', {kind}, 'f', frame)
redis.call('PUBLISH', {channel}, epoch .. ' ' .. seq .. ' ' .. {kind} .. ' ' .. frame)
"""


_INIT = _init("KEYS[1]", "KEYS[2]", "ARGV[1]")
# An append with a write id (ARGV[7], "" for none) is done once: the ids of the last
# ARGV[8] or so appends that carried one are kept in KEYS[3] (a sorted set, score: the
# seq; cut back to ARGV[8] once 32 more have come, its TTL ARGV[9] ms renewed by each, so
# it stays a small listpack and leaves with an idle document). An id that is there logs
# nothing and answers the seq and frame of the first attempt, with a 4th element 1: its
# reply was lost, or another instance's janitor ended the same orphan. Every id is looked
# up: an id looked up only after this process saw it fail missed a group retried whole
# after a later event failed, and another instance's retry.
# An id whose entry left the log (Redis lost it) is appended again.
_SEEN = """
local write = ARGV[7]
if write ~= '' then
  local seen = redis.call('ZSCORE', KEYS[3], write)
  if seen then
    local entry = redis.call('XRANGE', KEYS[2], seen .. '-1', seen .. '-1')
    if entry[1] then return {epoch, seen, entry[1][2][4], 1} end
  end
end
"""
_APPEND_REMEMBERED = _append("ARGV[2]", "ARGV[5]", "ARGV[3]", "ARGV[4]", "ARGV[6]") + """
if write ~= '' then
  redis.call('ZADD', KEYS[3], seq, write)
  local kept = tonumber(ARGV[8])
  if redis.call('ZCARD', KEYS[3]) > kept + 32 then
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(kept + 1))
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
return {epoch, seq, frame}
"""
APPEND_LUA = _INIT + _SEEN + _APPEND_REMEMBERED
# APPEND_LUA's, only while the run ARGV[10] is the active one (KEYS[4]) and ARGV[11]
# holds its lease (KEYS[5]), else 0 (`RedisBackend.append_fenced`): held text tried
# again after an outage, during which its run may have been taken over.
FENCED_APPEND_LUA = _INIT + _SEEN + """
local active = redis.call('GET', KEYS[4])
if not active or cjson.decode(active)['run_id'] ~= ARGV[10]
    or redis.call('GET', KEYS[5]) ~= ARGV[11] then return 0 end
""" + _APPEND_REMEMBERED
HEAD_LUA = _INIT + """
return {epoch, redis.call('HGET', KEYS[1], 'last_seq')}
"""
RUN_SLOT_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - 60000)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return oldest[2] + 60000 - ARGV[1]
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], 61000)
return 0
"""
CONNECTION_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if tonumber(ARGV[3]) > 0 and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], math.floor(ARGV[2] - ARGV[1]))
return 1
"""

# Active runs: the record in cw:{doc}:active (no TTL, so a dead owner's run can
# still be announced), the lease in the sorted set cw:leases (score: ms), and who
# holds that lease in cw:{doc}:owner: the instance that claimed the run, then the
# survivor that claimed it when the lease lapsed, "" while a draining owner hands
# it over. Only the holder may renew (so a stale renewal of an instance that let
# the run go cannot overwrite the next owner's checkpoint, or a handoff). The run's
# checkpoint parts (an append-only list, server/agent/checkpoint_parts.py) are in
# cw:{doc}:run-parts, appended by the renewal that writes the record counting them.
CLAIM_RUN_LUA = """
local active = redis.call('GET', KEYS[1])
if active then return active end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[4])
return false
"""
# The run is this instance's (`current`: its record), else 0.
_HELD = """
local active = redis.call('GET', KEYS[1])
if not active then return 0 end
local current = cjson.decode(active)
if current['run_id'] ~= ARGV[4] then return 0 end
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return 0 end
"""


def _renew(first_part: str, last_part: str) -> str:
    """The record, the lease, and the parts in ARGV[first_part..last_part]."""
    return f"""
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
if ARGV[6] == '1' then redis.call('DEL', KEYS[4]) end
for i = {first_part}, {last_part}, 1000 do
  redis.call('RPUSH', KEYS[4], unpack(ARGV, i, math.min(i + 999, {last_part})))
end
"""


RENEW_RUN_LUA = _HELD + _renew("7", "#ARGV") + "return 1\n"
# A decision's checkpoint (RENEW_RUN_LUA's write, its parts counted by ARGV[8]) and
# the events that announce it (APPEND_LUA's, for each (body, type) pair after the
# four common arguments at ARGV[9 + n]) in one step: an owner killed between the two
# used to leave a checkpoint whose events were never logged (a `tool.call` nobody
# saw, so the call timed out after a takeover). 0 when the lease is not held; 1 when
# this write (ARGV[7], the record's `write`) is already done: a retry after a reply
# that was lost logs nothing twice. Its events carry the write ids `<write>.<n>` in
# KEYS[7], as APPEND_LUA's do (kept ARGV[base + 4], TTL ARGV[base + 5]): the same
# decision's events appended alone (after Redis lost the run, `log_groups.same_write`)
# are not logged again by this write, nor these by such an append; one logged already
# answers seq 0.
RENEW_AND_APPEND_LUA = _HELD + """
if current['write'] == ARGV[7] then return 1 end
local last_part = 8 + tonumber(ARGV[8])
""" + _renew("9", "last_part") + """
local base = last_part + 1
""" + _init("KEYS[5]", "KEYS[6]", "ARGV[base]") + """
local out = {epoch}
local n = 0
for i = base + 6, #ARGV, 2 do
  local write = ''
  if ARGV[7] ~= '' then write = ARGV[7] .. '.' .. n end
  n = n + 1
  local seen = write ~= '' and redis.call('ZSCORE', KEYS[7], write)
  if seen and redis.call('XRANGE', KEYS[6], seen .. '-1', seen .. '-1')[1] then
    table.insert(out, 0)
    table.insert(out, '')
  else
""" + _append("ARGV[i]", "ARGV[i + 1]", "ARGV[base + 1]", "ARGV[base + 2]", "ARGV[base + 3]",
              "KEYS[5]", "KEYS[6]") + """
    if write ~= '' then redis.call('ZADD', KEYS[7], seq, write) end
    table.insert(out, seq)
    table.insert(out, frame)
  end
end
if n > 0 and ARGV[7] ~= '' then
  local kept = tonumber(ARGV[base + 4])
  if redis.call('ZCARD', KEYS[7]) > kept + 32 then
    redis.call('ZREMRANGEBYRANK', KEYS[7], 0, -(kept + 1))
  end
  redis.call('PEXPIRE', KEYS[7], ARGV[base + 5])
end
return out
"""
HAND_OFF_RUN_LUA = """
local active = redis.call('GET', KEYS[1])
if not active or cjson.decode(active)['run_id'] ~= ARGV[3] then return 0 end
if redis.call('GET', KEYS[3]) ~= ARGV[4] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[3], '')
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""
# Only the lease holder frees the document: an instance whose run was taken over
# (it stalled past its lease) must not end the run its survivor now drives.
RELEASE_RUN_LUA = """
local active = redis.call('GET', KEYS[1])
if active and cjson.decode(active)['run_id'] == ARGV[1]
    and redis.call('GET', KEYS[3]) == ARGV[3] then
  redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
  redis.call('ZREM', KEYS[2], ARGV[2])
end
return 0
"""
EXPIRED_RUNS_LUA = """
local docs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 20)
local out = {}
for _, doc in ipairs(docs) do
  local key = 'cw:{' .. doc .. '}:active'
  local active = redis.call('GET', key)
  if active then
    redis.call('ZADD', KEYS[1], ARGV[2], doc)
    redis.call('SET', 'cw:{' .. doc .. '}:owner', ARGV[3])
    table.insert(out, doc)
    table.insert(out, active)
  else
    redis.call('ZREM', KEYS[1], doc)
  end
end
return out
"""
# A message for a run goes to the inbox of the lease holder as read in the same step,
# so a takeover (which changes the holder) falls wholly before or after it. Returns
# false when the run is not active, "" when nobody else holds it yet (a handoff, or
# `ARGV[5]`, the caller, still named as holder although its run moved on). With
# ARGV[6] = '1' (a shutting-down caller's last try, `Lanes._park`) and the run's record
# naming the caller as owner, such a message goes to the caller's own inbox instead, in
# this same step: the next owner replays that inbox once it holds the lease. Checked
# and sent in two steps, a takeover and its replay could fall in between: the edit,
# counted as handed on, was never read.
SEND_TO_OWNER_LUA = """
local active = redis.call('GET', KEYS[1])
if not active then return false end
local record = cjson.decode(active)
if record['run_id'] ~= ARGV[1] then return false end
local owner = redis.call('GET', KEYS[2]) or record['owner']
if type(owner) ~= 'string' or owner == '' or owner == ARGV[5] then
  if ARGV[6] ~= '1' or ARGV[5] == '' or record['owner'] ~= ARGV[5] then return '' end
  owner = ARGV[5]
end
local inbox = 'cw:inbox:' .. owner
redis.call('XADD', inbox, 'MAXLEN', '~', ARGV[3], '*', 'm', ARGV[2])
redis.call('EXPIRE', inbox, ARGV[4])
return owner
"""
# A connection's entry ends with its instance's id: one of an instance that stopped
# heartbeating (killed) does not count, though it lingers until its own expiry; a
# run taken over from that instance then ends after the client grace, not its deadline.
PRESENT_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, member in ipairs(members) do
  if string.sub(member, 1, string.len(ARGV[2])) == ARGV[2] then
    local instance = string.match(member, '|([^|]*)$')
    if instance == nil or instance == '' then return 1 end
    local alive = redis.call('ZSCORE', KEYS[2], instance)
    if alive and tonumber(alive) >= tonumber(ARGV[1]) then return 1 end
  end
end
return 0
"""
# A run's record (KEYS[1] hash, field ARGV[1]) and the order records were first written
# (KEYS[2] sorted set): beyond ARGV[5] records the oldest go, as in the memory backend
# (a busy document's hash grew by one record per run, its TTL pushed back by each).
PUT_RUN_RECORD_LUA = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
local extra = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if extra > 0 then
  local old = redis.call('ZRANGE', KEYS[2], 0, extra - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, extra - 1)
  redis.call('HDEL', KEYS[1], unpack(old))
end
return 1
"""
