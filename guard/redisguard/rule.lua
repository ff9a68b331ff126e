-- The fence rule of docs/protocol.md ("Comparing tokens"), shared by
-- redisguard's scripts and the Redis Functions library (fence.lua).
-- Tokens and sequence numbers are uint64 values; Lua numbers in Redis are
-- doubles, exact only up to 2^53, so they never become numbers here.

-- less reports a < b for canonical decimal strings (no sign, no leading
-- zeros): the shorter is less, and of equal length the bytewise less.
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- check reads the mark hash and reports whether token t with sequence s
-- ('0': none) is stale against it, and the mark's token and sequence
-- ('0' when the scope has none).
local function check(mark, t, s, strict)
  local h = redis.call('HMGET', mark, 'token', 'seq')
  local ht, hs = h[1] or '0', h[2] or '0'
  local stale = less(t, ht)
  if t == ht and s ~= '0' then
    stale = less(s, hs) or (strict and s == hs)
  end
  return stale, ht, hs
end

-- advance records guard.Next(highest, write). It runs after the write, so a
-- write that raises an error leaves the mark where it was.
local function advance(mark, t, s, ht, hs)
  if less(ht, t) then
    redis.call('HSET', mark, 'token', t, 'seq', s)
  elseif less(hs, s) then
    redis.call('HSET', mark, 'seq', s)
  end
end
