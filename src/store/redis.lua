-- redis.lua - the Redis store's server side: one atomic state transition per
-- call, run with EVALSHA (src/store/redis.c loads it and embeds this file).
--
-- Division of labour. The client (redis.c) validates the call and prepares
-- the quota exactly as every other store does; this script only moves the
-- key's state forward, atomically, with the server's clock, and returns what
-- it saw. The client then runs the same pure step as the memory store
-- (src/core) on the returned old state and the returned now, so every
-- reported number comes from the one C implementation; the transitions below
-- mirror src/core/window.c, gcra.c and sliding.c and are checked against
-- them by tests/test_redis.c's differential test.
--
-- Numbers. Redis's Lua has only doubles (exact to 2^53), but tollgate's state
-- is 64-bit (bucket times in ns, counts up to 2^64 - 1). So every value is
-- carried as two limbs h, l with value = h * 1e10 + l, 0 <= l < 1e10: sums
-- and comparisons of limbs are exact, and a limb pair prints as 20 decimal
-- digits, the width every stored number has.
--
-- KEYS[1]  the key's state (the client names it prefix:{key}:algorithm)
-- ARGV[1]  op: r read only, w window add (inc or hit, cost > 0), s set,
--          h hit (buckets: 0 < cost <= burst; sliding: any cost)
-- ARGV[2]  algorithm, 0..4 as tg_algorithm
-- ARGV[3]  now in us since the epoch, or "" for the server's TIME
-- ARGV[4.] per op and algorithm, decimal u64:
--          windows  w/s: cost or value, period_ms
--          buckets  h: cost * T ns, tau ns;  s: fill * T ns
--          sliding  h: cost, limit, period_us, most entries kept
--
-- Stored value (a string; its TTL covers the time until it is fresh, rounded
-- up, plus 2 ms with the server's TIME or 1 s with a now the caller gave, so
-- a key never vanishes before its state is fresh, even when the caller's
-- clock runs a little behind the server's):
--   windows, buckets  "1" alg a(20 digits) b(20 digits)   (42 bytes)
--   sliding           "12" sum(20) then per entry t_us(20) cost(20)
-- Reply: windows, buckets {now_us, old a, old b, 1 if it wrote else 0} (a
--   and b "" when absent);
--   sliding {now_us, sum after pruning, allowed 1/0, entries left,
--   newest time left or "", time of the entry a denied call waits for or ""}.
-- Errors: "TGCORRUPT ..." when the stored value is not one of ours,
-- "TGARG ..." when the arguments are malformed (a client bug).
-- Redis commands per call: TIME (unless now is given), GET, then at most one
-- SET or DEL.

local B = 10000000000 -- 1e10, the limb base
local HMAX, LMAX = 1844674407, 3709551615 -- 2^64 - 1 in limbs

-- A decimal string of 1..20 digits as limbs, or nil.
local function parse(s)
  local n = #s
  if n == 0 or n > 20 or string.find(s, '%D') then
    return nil
  end
  if n <= 10 then
    return 0, tonumber(s)
  end
  local h, l = tonumber(string.sub(s, 1, n - 10)), tonumber(string.sub(s, n - 9))
  if h > HMAX or (h == HMAX and l > LMAX) then
    return nil
  end
  return h, l
end

local function fmt(h, l)
  return string.format('%010d%010d', h, l)
end

-- An integer x < 2^53 as limbs (the division is corrected, not trusted).
local function limbs(x)
  local h = math.floor(x / B)
  local l = x - h * B
  if l < 0 then
    h, l = h - 1, l + B
  elseif l >= B then
    h, l = h + 1, l - B
  end
  return h, l
end

local function cmp(ah, al, bh, bl)
  if ah ~= bh then
    return ah < bh and -1 or 1
  end
  if al ~= bl then
    return al < bl and -1 or 1
  end
  return 0
end

-- a + b, or nil on passing 2^64 - 1.
local function add(ah, al, bh, bl)
  local h, l = ah + bh, al + bl
  if l >= B then
    h, l = h + 1, l - B
  end
  if h > HMAX or (h == HMAX and l > LMAX) then
    return nil
  end
  return h, l
end

-- a - b for a >= b.
local function sub(ah, al, bh, bl)
  local h, l = ah - bh, al - bl
  if l < 0 then
    h, l = h - 1, l + B
  end
  return h, l
end

-- a * 1000 (us to ns); a below 2^64 / 1000.
local function mul1000(h, l)
  local x = l * 1000
  local c = math.floor(x / B)
  return h * 1000 + c, x - c * B
end

-- Margin added to every TTL, ms: doubles are inexact above 2^53, and a now
-- the caller gives may run behind the server's clock. A late expiry is
-- harmless: a fresh state and an absent one give the same answers.
local slack = ARGV[3] == '' and 2 or 1000

-- TTL in ms for a state fresh (a - now) / unit ms from now, rounded up.
local function ttl(ah, al, nh, nl, unit)
  if cmp(ah, al, nh, nl) <= 0 then
    return slack
  end
  local dh, dl = sub(ah, al, nh, nl)
  return math.floor((dh * B + dl) / unit) + slack
end

-- Raises an error reply with exactly this text (no script position).
local function fail(msg)
  error({err = msg})
end

local function arg(i)
  local h, l = parse(ARGV[i] or '')
  if not h then
    fail('TGARG argument ' .. i .. ' is not a u64')
  end
  return h, l
end

local key, op, alg = KEYS[1], ARGV[1], ARGV[2]
local nh, nl
if ARGV[3] == '' then
  local t = redis.call('TIME')
  nh, nl = limbs(tonumber(t[1]) * 1000000 + tonumber(t[2]))
else
  nh, nl = arg(3)
end
local now = fmt(nh, nl)
local cur = redis.call('GET', key)

local function corrupt(why)
  fail('TGCORRUPT ' .. why)
end

if alg == '2' then
  -- The sliding log (src/core/sliding.c): prune, decide, append, with the
  -- sum kept in the head so a decision reads only what it prunes or walks.
  local ch, cl = arg(4)
  local mh, ml = arg(5)
  local ph, pl = arg(6)
  local cap = tonumber(ARGV[7])
  if op ~= 'h' or not cap or cap < 1 then
    fail('TGARG sliding call')
  end
  local s = cur or ('12' .. fmt(0, 0))
  local n = (#s - 22) / 40
  if string.sub(s, 1, 2) ~= '12' or n < 0 or n ~= math.floor(n) then
    return corrupt('sliding log of ' .. #s .. ' bytes')
  end
  local sh, sl = parse(string.sub(s, 3, 22))
  if not sh then
    return corrupt('sliding sum')
  end
  local function entry(i) -- the i-th entry (0 = oldest): t, cost as limbs
    local off = 23 + 40 * i
    local th, tl = parse(string.sub(s, off, off + 19))
    local eh, el = parse(string.sub(s, off + 20, off + 39))
    -- times are at most TG_NOW_MAX_US = 9e15
    if not th or not eh or cmp(th, tl, 900000, 0) > 0 then
      fail('TGCORRUPT sliding entry ' .. i)
    end
    return th, tl, eh, el
  end
  -- expired: t + period <= now
  local k = 0
  while k < n do
    local th, tl, eh, el = entry(k)
    local xh, xl = add(th, tl, ph, pl)
    if not xh or cmp(xh, xl, nh, nl) > 0 then
      break
    end
    if cmp(sh, sl, eh, el) >= 0 then
      sh, sl = sub(sh, sl, eh, el)
    else
      sh, sl = 0, 0
    end
    k = k + 1
  end
  local sum = fmt(sh, sl)
  local left = n - k
  local body = string.sub(s, 23 + 40 * k)
  -- allowed: cost <= limit and sum + cost <= limit
  local allowed = false
  local th, tl = add(sh, sl, ch, cl)
  if th and cmp(th, tl, mh, ml) <= 0 then
    allowed = true
  end
  local changed = k > 0
  if allowed and (ch > 0 or cl > 0) then
    sh, sl = th, tl
    local merged = false
    if left > 0 then
      local lh, ll, eh, el = entry(n - 1)
      if cmp(lh, ll, nh, nl) >= 0 or left >= cap then
        if cmp(nh, nl, lh, ll) > 0 then
          lh, ll = nh, nl
        end
        eh, el = add(eh, el, ch, cl)
        body = string.sub(body, 1, 40 * (left - 1)) .. fmt(lh, ll) .. fmt(eh, el)
        merged = true
      end
    end
    if not merged then
      body = body .. now .. fmt(ch, cl)
      left = left + 1
    end
    changed = true
  end
  local newest = ''
  local wh, wl
  if left > 0 then
    newest = string.sub(body, 40 * (left - 1) + 1, 40 * (left - 1) + 20)
    local yh, yl = parse(newest)
    if not yh then
      return corrupt('sliding newest entry')
    end
    wh, wl = add(yh, yl, ph, pl)
  end
  if changed then
    if left > 0 then
      redis.call('SET', key, '12' .. fmt(sh, sl) .. body, 'PX',
        ttl(wh, wl, nh, nl, 1000))
    else
      redis.call('DEL', key)
    end
  end
  -- a denied call that may pass later waits until the oldest entries whose
  -- costs add up to need = sum - (limit - cost) have expired
  local wait = ''
  if not allowed and cmp(ch, cl, mh, ml) <= 0 then
    local dh, dl = sub(mh, ml, ch, cl)
    local gh, gl = parse(sum)
    local qh, ql = sub(gh, gl, dh, dl)
    local ah, al = 0, 0
    for i = k, n - 1 do
      local eth, etl, eh, el = entry(i)
      ah, al = add(ah, al, eh, el)
      if not ah or cmp(ah, al, qh, ql) >= 0 then
        wait = fmt(eth, etl)
        break
      end
    end
  end
  return {now, sum, allowed and 1 or 0, left, newest, wait}
end

-- Windows and buckets: one pair (a, b).
local ah, al, bh, bl = 0, 0, 0, 0
if cur then
  if #cur ~= 42 or string.sub(cur, 1, 2) ~= '1' .. alg then
    return corrupt('state of ' .. #cur .. ' bytes')
  end
  ah, al = parse(string.sub(cur, 3, 22))
  bh, bl = parse(string.sub(cur, 23, 42))
  if not ah or not bh then
    return corrupt('state digits')
  end
  -- numbers tollgate never writes (tg__state_plausible): windows end by
  -- TG_NOW_MAX_US + TG_PERIOD_MAX_MS = 1e16 us; a TAT is at most
  -- TG_NOW_MAX_US in ns + TG_TOLERANCE_MAX_NS = 1.3e19 ns, with b = 0
  if alg == '3' or alg == '4' then
    if cmp(ah, al, 1300000000, 0) > 0 or bh ~= 0 or bl ~= 0 then
      return corrupt('bucket state out of range')
    end
  elseif cmp(ah, al, 1000000, 0) > 0 then
    return corrupt('window end out of range')
  end
end
local old = {now, cur and fmt(ah, al) or '', cur and fmt(bh, bl) or '', 0}
if op == 'r' then
  return old
end

if alg == '0' or alg == '1' then
  -- src/core/window.c: the window the call falls into, then add or set.
  local vh, vl = arg(4)
  local pms = tonumber(ARGV[5])
  if not pms or pms < 1 or (op ~= 'w' and op ~= 's') then
    fail('TGARG window call')
  end
  local eh, el -- end of the window a write goes into, us
  if alg == '0' then
    -- epoch windows: end = (floor(now_ms / period_ms) + 1) * period_ms;
    -- now_ms <= 9e15 < 2^53, so this is exact once the quotient is checked
    local now_ms = nh * 10000000 + math.floor(nl / 1000)
    local q = math.floor(now_ms / pms)
    if q * pms > now_ms then
      q = q - 1
    elseif (q + 1) * pms <= now_ms then
      q = q + 1
    end
    eh, el = mul1000(limbs((q + 1) * pms))
    if cur and cmp(ah, al, eh, el) >= 0 then
      eh, el = ah, al -- the stored window is current (or later)
    else
      bh, bl = 0, 0
    end
  else
    -- per-key windows: active while end > now
    if cur and cmp(ah, al, nh, nl) > 0 and op == 'w' then
      eh, el = ah, al
    else
      eh, el = add(nh, nl, limbs(pms * 1000))
      bh, bl = 0, 0
    end
  end
  local ch, cl
  if op == 'w' then
    ch, cl = add(bh, bl, vh, vl)
    if not ch then
      return old -- the count would pass 2^64 - 1: TG_EOVERFLOW, no write
    end
  else
    ch, cl = vh, vl
  end
  redis.call('SET', key, '1' .. alg .. fmt(eh, el) .. fmt(ch, cl), 'PX',
    ttl(eh, el, nh, nl, 1000))
  old[4] = 1
  return old
end

if alg == '3' or alg == '4' then
  -- src/core/gcra.c: one theoretical arrival time in ns.
  local xh, xl = arg(4)
  local zh, zl = mul1000(nh, nl)
  local th, tl
  if op == 'h' then
    -- tat' = max(tat, now) + cost * T, allowed iff tat' <= now + tau
    local uh, ul = arg(5)
    if cmp(ah, al, zh, zl) > 0 then
      th, tl = add(ah, al, xh, xl)
    else
      th, tl = add(zh, zl, xh, xl)
    end
    local mh, ml = add(zh, zl, uh, ul)
    if not th or not mh or cmp(th, tl, mh, ml) > 0 then
      return old -- denied: nothing changes
    end
  elseif op == 's' then
    th, tl = add(zh, zl, xh, xl) -- tat = now + fill * T
    if not th then
      fail('TGARG bucket set')
    end
  else
    fail('TGARG bucket op')
  end
  redis.call('SET', key, '1' .. alg .. fmt(th, tl) .. fmt(0, 0), 'PX',
    ttl(th, tl, zh, zl, 1000000))
  old[4] = 1
  return old
end

fail('TGARG algorithm')
