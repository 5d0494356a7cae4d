"""The Lua scripts of the Redis backend: each runs atomically on one document's
keys (or the lease set), so seq, fan-out and run ownership need no locks."""

_INIT = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  epoch = ARGV[1]
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'epoch', epoch, 'last_seq', 0)
end
"""
APPEND_LUA = _INIT + """
local seq = redis.call('HINCRBY', KEYS[1], 'last_seq', 1)
local frame = ARGV[2] .. ',"seq":' .. seq .. ',"ts":' .. ARGV[3] .. '}'
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], seq .. '-1', 't', ARGV[5], 'f', frame)
redis.call('PUBLISH', ARGV[6], seq .. ' ' .. ARGV[5] .. ' ' .. frame)
return {epoch, seq, frame}
"""
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
# still be announced), the lease in the sorted set cw:leases (score: ms).
CLAIM_RUN_LUA = """
local active = redis.call('GET', KEYS[1])
if active then return active end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return false
"""
RENEW_RUN_LUA = """
local active = redis.call('GET', KEYS[1])
if not active or cjson.decode(active)['run_id'] ~= ARGV[4] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
if ARGV[5] == '1' then redis.call('DEL', KEYS[3]) end
if #ARGV > 5 then redis.call('RPUSH', KEYS[3], unpack(ARGV, 6)) end
return 1
"""
RELEASE_RUN_LUA = """
local active = redis.call('GET', KEYS[1])
if active and cjson.decode(active)['run_id'] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('DEL', KEYS[3])
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
    table.insert(out, doc)
    table.insert(out, active)
  else
    redis.call('ZREM', KEYS[1], doc)
  end
end
return out
"""
PRESENT_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, member in ipairs(members) do
  if string.sub(member, 1, string.len(ARGV[2])) == ARGV[2] then return 1 end
end
return 0
"""
