-- fence's guard as Redis functions, for writers in any language: fenced
-- SET, DEL, HSET and INCRBY, and a check and advance of the mark with no
-- write, called with FCALL. Library() puts the library's first line and
-- rule.lua (less, check, advance) before this.
--
--   FCALL fence_set     2   MARK KEY     TOKEN SEQ VALUE [SET option ...]
--   FCALL fence_del     1+N MARK KEY...  TOKEN SEQ
--   FCALL fence_hset    2   MARK KEY     TOKEN SEQ FIELD VALUE [FIELD VALUE ...]
--   FCALL fence_incrby  2   MARK KEY     TOKEN SEQ INCREMENT
--   FCALL fence_advance 1   MARK         TOKEN SEQ
--
-- MARK is the scope's mark as redisguard keeps it: "fence:{SCOPE}" (the
-- hash tag is the scope), and nothing else: a key of another prefix is
-- refused, since it would be a fresh mark of its own. Every KEY must carry the same tag, as
-- redisguard.Key makes them ("{SCOPE}:name"), so that Go and FCALL writers
-- share one mark. fence_advance takes the mark alone: it checks the token
-- as the others do and advances the mark, writing nothing else (what
-- PostgreSQL's and MySQL's fence_advance do), and answers OK. TOKEN is 1
-- to 2^63-1, SEQ 0 (none) to 2^64-1, both in decimal. A stale call returns
-- the error
--   STALE scope=S presented_token=T highest_token=H presented_seq=Q highest_seq=R
-- and changes nothing; bad arguments return an error starting "ERR fence:".
-- Sequences follow the non-strict rule: an equal sequence is accepted.

local max_token = '9223372036854775807'
local max_seq = '18446744073709551615'

local function bad(msg)
  return redis.error_reply('ERR fence: ' .. msg)
end

-- decimal refuses v unless it is a canonical decimal from 1 (0 if zero)
-- to max.
local function decimal(name, v, max, zero)
  if (zero and v == '0') or (v:match('^[1-9]%d*$') and not less(max, v)) then
    return nil
  end
  return bad(string.format('%s %q is not a decimal integer from %s to %s', name, v, zero and '0' or '1', max))
end

-- scope_of returns the scope whose mark is key: fence:{SCOPE}, exactly the
-- key of redisguard's DefaultPrefix. A mark of any other prefix (a typo, a
-- prefix of the writer's own) would be a fresh mark that no other writer
-- of the scope reads, and let a stale token pass. The scope must be one the
-- protocol admits, so that the fields of a STALE error split on spaces.
local function scope_of(mark)
  local scope = mark:match('^fence:{([^}]*)}$')
  if not scope then
    return nil, bad(string.format('the first key, %q, is not the mark of a scope: want "fence:{SCOPE}", such as "fence:{orders}"', mark))
  end
  local ok = #scope >= 1 and #scope <= 256
  for seg in (scope .. '/'):gmatch('([^/]*)/') do
    ok = ok and seg:match('^[A-Za-z0-9._-]+$') ~= nil and seg ~= '.' and seg ~= '..'
  end
  if not ok then
    return nil, bad(string.format('%q is not a scope: 1 to 256 bytes of ASCII letters, digits, ".", "_", "-" and "/"', scope))
  end
  return scope
end

-- owns refuses a data key unless its hash tag is the scope, and any key
-- shaped like a mark (ending with its tag), which only the guard writes.
local function owns(scope, key)
  if key:match('^[^{]*{[^}]*}$') then
    return bad(string.format('%q is a fencing mark, which only the guard writes', key))
  end
  local tag = key:match('^[^{]*{([^}]+)}')
  if tag ~= scope then
    return bad(string.format('key %q does not belong to scope %q: write keys tagged {%s}, such as "{%s}:name"', key, scope, scope, scope))
  end
  return nil
end

-- want_keys says what a call of ndata data keys (nil: one or more) takes.
local want_keys = {
  [0] = 'want 1 key: the mark alone, "fence:{SCOPE}"; fence_advance writes no data key',
  [1] = 'want 2 keys: the mark and the key',
  any = 'want the mark and at least one key',
}

-- fenced checks a call's keys and token, runs op if the token is current,
-- advances the mark and returns op's reply. keys are the mark and then
-- exactly ndata data keys, or at least one when ndata is nil; op needs at
-- least nargs arguments after TOKEN and SEQ.
local function fenced(keys, args, ndata, nargs, op)
  local n = #keys - 1
  if (ndata and n ~= ndata) or (not ndata and n < 1) then
    return bad(want_keys[ndata or 'any'])
  end
  if #args < 2 + nargs then
    return bad(ndata == 0 and 'want TOKEN SEQ' or string.format('want TOKEN SEQ and at least %d more arguments', nargs))
  end
  local scope, err = scope_of(keys[1])
  if err then return err end
  for i = 2, #keys do
    err = owns(scope, keys[i])
    if err then return err end
  end
  local t, s = args[1], args[2]
  err = decimal('token', t, max_token, false) or decimal('sequence', s, max_seq, true)
  if err then return err end
  local stale, ht, hs = check(keys[1], t, s, false)
  if stale then
    return redis.error_reply(string.format('STALE scope=%s presented_token=%s highest_token=%s presented_seq=%s highest_seq=%s',
      scope, t, ht, s, hs))
  end
  local r = op({unpack(keys, 2)}, {unpack(args, 3)})
  advance(keys[1], t, s, ht, hs)
  return r
end

redis.register_function('fence_set', function(keys, args)
  return fenced(keys, args, 1, 1, function(k, a) return redis.call('SET', k[1], unpack(a)) end)
end)
redis.register_function('fence_del', function(keys, args)
  return fenced(keys, args, nil, 0, function(k) return redis.call('DEL', unpack(k)) end)
end)
redis.register_function('fence_hset', function(keys, args)
  return fenced(keys, args, 1, 2, function(k, a) return redis.call('HSET', k[1], unpack(a)) end)
end)
redis.register_function('fence_incrby', function(keys, args)
  return fenced(keys, args, 1, 1, function(k, a) return redis.call('INCRBY', k[1], unpack(a)) end)
end)
-- fence_advance is the check and advance alone, for a caller that writes
-- elsewhere or only moves the mark (a follower of the service's leases).
-- It takes TOKEN SEQ and nothing more, so that a misplaced value is refused
-- rather than ignored.
redis.register_function('fence_advance', function(keys, args)
  if #args > 2 then
    return bad('fence_advance takes TOKEN SEQ and nothing more')
  end
  return fenced(keys, args, 0, 0, function() return redis.status_reply('OK') end)
end)
