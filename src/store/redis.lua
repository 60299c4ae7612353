-- SPDX-License-Identifier: MIT
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
-- Numbers. Redis's Lua has only doubles, exact for integers below 2^53, but
-- tollgate's state is 64-bit. Each transition therefore comes twice: a fast
-- path in plain doubles, taken when every operand is below F = 2^52 (so sums
-- of two stay exact: the usual case, whose times are below 2^52 us until the
-- year 2112), and an exact path on limbs (a u64 as h * 1e10 + l) for the
-- rest. The differential test draws quotas and costs that take both.
--
-- KEYS[1]  the key's state (the client names it prefix:{key}:algorithm)
-- ARGV[1]  op: r read only, w window add (inc or hit, cost > 0), s set,
--          h hit (buckets: 0 < cost <= burst; sliding: any cost), p a
--          policy's rule (windows, buckets; see P at the end), also sent
--          alone for a window: a hit that counts only an admitted cost
-- ARGV[2]  algorithm, 0..4 as tg_algorithm
-- ARGV[3]  now in us since the epoch, or "" for the server's TIME
-- ARGV[4.] per op and algorithm, decimal u64:
--          windows  w/s: cost or value, period_ms;  p: cost, period_ms, limit
--          buckets  h/p: cost * T ns, tau ns;  s: fill * T ns
--          sliding  h: cost, limit, period_us, most entries kept
-- A policy (P, at the end) runs the same transitions for all its rules in
-- one call: checked first, written only when the policy passes.
--
-- Stored value, a string whose TTL covers the time until the state is fresh,
-- rounded down, plus 2 ms with the server's TIME or 1 s with a now the caller
-- gave (a key must never vanish before its state is fresh, even when the
-- caller's clock runs a little behind the server's; a later expiry is
-- harmless: a fresh state and an absent one give the same answers):
--   windows  "0:END:COUNT" / "1:END:COUNT"  end of the window in us
--   buckets  "3:US:NS" / "4:US:NS"  theoretical arrival time US * 1000 + NS
--            ns, 0 <= NS <= 999
--   sliding  "2" SUM(20 digits), then per entry T(20) COST(20), oldest
--            first: fixed widths, so an entry is found without a scan
-- Reply: windows, buckets {now_us, the old value or "", 1 if it wrote else 0}
--   (the client parses the old value: it is the state the step runs on);
--   sliding {now_us, sum after pruning, allowed 1/0, entries left, newest
--   time left or "", time of the entry a denied call waits for or ""}.
-- Errors: "TGCORRUPT ..." when the stored value is not one of ours,
-- "TGARG ..." when the arguments are malformed (a client bug).
-- Redis commands per call: TIME (unless now is given), GET, then at most one
-- SET or DEL.

local F = 4503599627370496 -- 2^52
local B = 10000000000 -- 1e10, the limb base
local HMAX, LMAX = 1844674407, 3709551615 -- 2^64 - 1 in limbs

-- Names the rule a corrupt value belongs to in a policy ('rule I '), else ''.
local tag = ''

-- Raises an error reply with exactly this text.
local function fail(msg)
  error({err = msg})
end

local function corrupt(why)
  fail('TGCORRUPT ' .. tag .. why)
end

-- ---- limbs: the exact path ----

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

-- Limbs as a plain decimal string, or as 20 digits when wide.
local function fmt(h, l, wide)
  if wide then
    return string.format('%010d%010d', h, l)
  end
  if h == 0 then
    return string.format('%d', l)
  end
  return string.format('%d%010d', h, l)
end

-- Integers x < 2^53 and d > 0 as q, r with x = d q + r, 0 <= r < d: the
-- quotient of doubles is corrected, not trusted.
local function divmod(x, d)
  local q = math.floor(x / d)
  local r = x - q * d
  if r < 0 then
    q, r = q - 1, r + d
  elseif r >= d then
    q, r = q + 1, r - d
  end
  return q, r
end

-- An integer x < 2^53 as limbs.
local function limbs(x)
  return divmod(x, B)
end

-- The end, in ms, of the epoch window of now_ms (<= 9e15) for a period of
-- pms ms: (floor(now_ms / pms) + 1) * pms, exact below 2^53.
local function epoch_end_ms(now_ms, pms)
  return (divmod(now_ms, pms) + 1) * pms
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

-- a * 1000; a below 2^64 / 1000.
local function mul1000(h, l)
  local x = l * 1000
  local c = math.floor(x / B)
  return h * 1000 + c, x - c * B
end

-- a / 1000 (as limbs) and a % 1000.
local function divmod1000(h, l)
  local q = math.floor(l / 1000) -- exact: l < 1e10
  local hq = math.floor(h / 1000)
  return hq, (h - hq * 1000) * 10000000 + q, l - q * 1000
end

-- The call's arguments: ARGV, or one rule's of a policy (A[4..7]).
local A = ARGV

local function arg(i)
  local h, l = parse(A[i] or '')
  if not h then
    fail('TGARG argument ' .. i .. ' is not a u64')
  end
  return h, l
end

-- A number argument for the fast path: its value when below F, else nil (the
-- exact path will read it).
local function num(i)
  local x = tonumber(A[i])
  if not x then
    fail('TGARG argument ' .. i .. ' is not a number')
  end
  return x < F and x or nil
end

-- ---- the call ----

-- Redis 3.2 to 6 replicate a script that reads TIME and then writes only
-- when it replicates its effects, not itself (Redis 7 always does).
if redis.replicate_commands then
  redis.replicate_commands()
end

-- Several keys at once, for policies, reservations and cancels, whose
-- arithmetic the client does with the core on what it read:
--   R  reads: ARGV[2] now or "" for TIME; KEYS[1..n]
--      -> {now_us, value of each key or ""}
--   C  writes if nothing changed: per key i, ARGV[3i] the value read ("" for
--      absent), ARGV[3i+1] the new one ("" leaves the key, "-" deletes it),
--      ARGV[3i+2] its PX in ms -> 1 written, 0 a key changed meanwhile
--      (nothing written: the client reads again)
-- A key of another type answers WRONGTYPE (TG_ECORRUPT).
if ARGV[1] == 'R' then
  local out = {}
  if ARGV[2] == '' then
    local t = redis.call('TIME')
    out[1] = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  else
    out[1] = ARGV[2]
  end
  for i = 1, #KEYS do
    out[i + 1] = redis.call('GET', KEYS[i]) or ''
  end
  return out
end
if ARGV[1] == 'C' then
  for i = 1, #KEYS do
    if (redis.call('GET', KEYS[i]) or '') ~= ARGV[3 * i] then
      return 0
    end
  end
  for i = 1, #KEYS do
    local v = ARGV[3 * i + 1]
    if v == '-' then
      redis.call('DEL', KEYS[i])
    elseif v ~= '' then
      redis.call('SET', KEYS[i], v, 'PX', ARGV[3 * i + 2])
    end
  end
  return 1
end

-- The now of the call (of every rule of a policy): ARGV[3], or ARGV[2] for P.
local now_arg = ARGV[1] == 'P' and ARGV[2] or ARGV[3]
local slack, now, now_s
if now_arg == '' then
  slack = 2
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  now_s = string.format('%d', now)
else
  slack = 1000
  now_s = now_arg
  now = tonumber(now_s)
end
if not now or now >= F then
  now = nil -- only the exact path handles it (the year 2112 and later)
end
-- now as limbs, for the exact paths (the server's time is below 2^53)
local function now_limbs()
  if now_arg == '' then
    return limbs(tonumber(now_s))
  end
  local h, l = parse(now_arg)
  if not h then
    fail('TGARG now is not a u64')
  end
  return h, l
end

-- Writes: at once, or, while a policy checks its rules (pending ~= nil),
-- kept for when every rule has been checked.
local pending
local function put(key, v, px)
  if pending then
    pending[#pending + 1] = {key, v, px}
  else
    redis.call('SET', key, v, 'PX', px)
  end
end
local function del(key)
  if pending then
    pending[#pending + 1] = {key}
  else
    redis.call('DEL', key)
  end
end

-- A policy's rule (op 'p', see the end): whether it allows (true, false),
-- or 'bad' when the C step fails: nothing may be written.
local verdict

local function window(key, op, alg, cur)
  -- src/core/window.c: the window the call falls into, then add or set.
  local a_s, b_s
  if cur then
    a_s, b_s = string.match(cur, '^%d:(%d+):(%d+)$')
    if not a_s or string.sub(cur, 1, 1) ~= alg or #a_s > 20 or #b_s > 20 then
      corrupt('window state')
    end
  end
  if op == 'r' then
    return {now_s, cur or '', 0}
  end
  if op ~= 'w' and op ~= 's' and op ~= 'p' then
    fail('TGARG window op')
  end
  -- p: a policy's rule (src/core/window.c, policy_step): counts only when
  -- count + cost <= limit (A[6]), and only a cost > 0
  local v, pms = num(4), tonumber(A[5])
  local lim = 0
  if op == 'p' then
    lim = num(6)
  end
  if not pms or pms < 1 or pms > 1000000000000 then
    fail('TGARG window period')
  end
  local a, b = 0, 0
  if cur then
    a, b = tonumber(a_s), tonumber(b_s)
  end
  if now and v and lim and a < F and b < F then
    -- fast: every sum below is of two values under 2^52
    local e -- end of the window written, us
    if alg == '0' then
      e = epoch_end_ms(divmod(now, 1000), pms) * 1000
      if cur and a >= e then
        e = a -- the stored window is current (or later)
      else
        b = 0
      end
    elseif cur and a > now and op ~= 's' then
      e = a -- an active per-key window keeps its end
    else
      e, b = now + pms * 1000, 0
    end
    local c = op ~= 's' and b + v or v
    if op == 'p' then
      verdict = c <= lim
      if not verdict or v == 0 then
        return {now_s, cur or '', 0}
      end
    end
    if not cur and c == 0 and alg == '0' then
      -- set(0) on an absent key: the state is fresh, and the memory store
      -- does not create a key for a fresh state either
      return {now_s, '', 0}
    end
    put(key, alg .. string.format(':%d:%d', e, c),
      math.floor((e - now) / 1000) + slack)
    return {now_s, cur or '', 1}
  end
  -- exact: limbs
  local nh, nl = now_limbs()
  local ah, al, bh, bl = 0, 0, 0, 0
  if cur then
    ah, al = parse(a_s)
    bh, bl = parse(b_s)
    -- numbers tollgate never writes (tg__state_plausible): windows end by
    -- TG_NOW_MAX_US + TG_PERIOD_MAX_MS = 1e16 us
    if not ah or not bh or cmp(ah, al, 1000000, 0) > 0 then
      corrupt('window state out of range')
    end
  end
  local vh, vl = arg(4)
  local eh, el
  if alg == '0' then
    local now_ms = nh * 10000000 + math.floor(nl / 1000) -- <= 9e15
    eh, el = mul1000(limbs(epoch_end_ms(now_ms, pms)))
    if cur and cmp(ah, al, eh, el) >= 0 then
      eh, el = ah, al
    else
      bh, bl = 0, 0
    end
  elseif cur and cmp(ah, al, nh, nl) > 0 and op ~= 's' then
    eh, el = ah, al
  else
    eh, el = add(nh, nl, limbs(pms * 1000))
    bh, bl = 0, 0
  end
  local ch, cl = vh, vl
  if op ~= 's' then
    ch, cl = add(bh, bl, vh, vl)
    if not ch then
      -- past 2^64 - 1: a hit's TG_EOVERFLOW (no write); a policy's rule,
      -- which counts nothing when it denies, denies (window.c)
      if op == 'p' then
        verdict = false
      else
        verdict = 'bad'
      end
      return {now_s, cur or '', 0}
    end
  end
  if op == 'p' then
    local lh, ll = arg(6)
    verdict = cmp(ch, cl, lh, ll) <= 0
    if not verdict or (vh == 0 and vl == 0) then
      return {now_s, cur or '', 0}
    end
  end
  if not cur and ch == 0 and cl == 0 and alg == '0' then
    return {now_s, '', 0} -- fresh: not created (as on the fast path)
  end
  local dh, dl = sub(eh, el, nh, nl)
  put(key, alg .. ':' .. fmt(eh, el) .. ':' .. fmt(ch, cl),
    math.floor((dh * B + dl) / 1000) + slack)
  return {now_s, cur or '', 1}
end

local function bucket(key, op, alg, cur)
  -- src/core/gcra.c: the theoretical arrival time, tat' = max(tat, now) +
  -- cost * T, allowed iff tat' <= now + tau; a set puts it at now + fill * T.
  local u_s, f_s
  if cur then
    u_s, f_s = string.match(cur, '^%d:(%d+):(%d%d?%d?)$')
    if not u_s or string.sub(cur, 1, 1) ~= alg or #u_s > 20 then
      corrupt('bucket state')
    end
  end
  if op == 'r' then
    return {now_s, cur or '', 0}
  end
  -- p: a policy's rule, as h but for any cost (the client sends one above
  -- the burst as tau + 1 ns), and a cost of 0 writes nothing
  if op ~= 'h' and op ~= 's' and op ~= 'p' then
    fail('TGARG bucket op')
  end
  local x = num(4) -- cost * T or fill * T, ns
  local tau = 0 -- (not "op ~= 's' and num(5) or 0": num may answer nil)
  if op ~= 's' then
    tau = num(5)
  end
  local u, f = 0, 0
  if cur then
    u, f = tonumber(u_s), tonumber(f_s)
  end
  if now and x and tau and u < F and u - now < 4000000000000 then
    -- fast: the debt d = tat - now < 4e15 ns, x and tau < 2^52 ns
    local d2 = x
    if op ~= 's' then
      if u >= now then
        d2 = (u - now) * 1000 + f + x
      end
      verdict = d2 <= tau
      if not verdict or x == 0 then
        return {now_s, cur or '', 0} -- denied (or no cost): nothing changes
      end
    end
    if not cur and d2 == 0 then
      -- a set to full (token) or empty (leaky) on an absent key: fresh, so
      -- not created, as in the memory store
      return {now_s, '', 0}
    end
    local q, r = divmod(d2, 1000) -- tat' = now * 1000 + d2 ns
    put(key, alg .. string.format(':%d:%d', now + q, r),
      math.floor(d2 / 1000000) + slack)
    return {now_s, cur or '', 1}
  end
  -- exact: limbs, in ns
  local nh, nl = now_limbs()
  local zh, zl = mul1000(nh, nl)
  local ah, al = 0, 0
  if cur then
    local uh, ul = parse(u_s)
    -- a TAT is at most TG_NOW_MAX_US in ns + TG_TOLERANCE_MAX_NS + the
    -- longest reservation wait (TG_PERIOD_MAX_MS) = 1.4e19
    if not uh or cmp(uh, ul, 1400000, 0) > 0 then
      corrupt('bucket state out of range')
    end
    ah, al = mul1000(uh, ul)
    ah, al = add(ah, al, 0, f)
    if not ah or cmp(ah, al, 1400000000, 0) > 0 then
      corrupt('bucket state out of range')
    end
  end
  local xh, xl = arg(4)
  local th, tl
  if op ~= 's' then
    local uh, ul = arg(5)
    if cmp(ah, al, zh, zl) > 0 then
      th, tl = add(ah, al, xh, xl)
    else
      th, tl = add(zh, zl, xh, xl)
    end
    local mh, ml = add(zh, zl, uh, ul)
    verdict = th and mh and cmp(th, tl, mh, ml) <= 0
    if not verdict or (xh == 0 and xl == 0) then
      return {now_s, cur or '', 0}
    end
  else
    th, tl = add(zh, zl, xh, xl)
    if not th then
      fail('TGARG bucket set')
    end
  end
  if not cur and cmp(th, tl, zh, zl) == 0 then
    return {now_s, '', 0} -- fresh: not created (as on the fast path)
  end
  local qh, ql, r = divmod1000(th, tl)
  local dh, dl = sub(th, tl, zh, zl)
  put(key, alg .. ':' .. fmt(qh, ql) .. ':' .. string.format('%d', r),
    math.floor((dh * B + dl) / 1000000) + slack)
  return {now_s, cur or '', 1}
end

-- The sliding log (src/core/sliding.c): prune the expired head, decide,
-- append or merge, with the sum kept in the head so a decision reads only
-- what it prunes, the newest entry, and what a denied call waits for.
local function sliding(key, op, cur)
  if op ~= 'h' then
    fail('TGARG sliding op')
  end
  local cap = tonumber(A[7])
  if not cap or cap < 1 then
    fail('TGARG sliding cap')
  end
  local s = cur or '200000000000000000000'
  local n = (#s - 21) / 40
  if string.sub(s, 1, 1) ~= '2' or n < 0 or n ~= math.floor(n) then
    corrupt('sliding log of ' .. #s .. ' bytes')
  end

  -- Writes the log back (or deletes it when empty) with its TTL: newest + period
  -- - now, in us, as a double (approximate is enough: see slack).
  local function store(sum_s, body, left, until_us)
    if left > 0 then
      put(key, '2' .. sum_s .. body, math.floor(until_us / 1000) + slack)
    else
      del(key)
    end
  end

  -- fast: every number below 2^52; nil when one is not (then the exact path
  -- runs the call from the start: nothing has been written yet)
  local function fast()
    local cost, limit, period = num(4), num(5), num(6)
    local sum_f = string.sub(s, 2, 21)
    if string.find(sum_f, '%D') then
      corrupt('sliding sum')
    end
    local sum = tonumber(sum_f)
    if not (now and cost and limit and period and sum < F) then
      return nil
    end
    local function entry(i) -- t, cost of the i-th oldest entry, or nil
      local off = 22 + 40 * i
      local t_f, c_f = string.sub(s, off, off + 19), string.sub(s, off + 20, off + 39)
      if string.find(t_f, '%D') or string.find(c_f, '%D') then
        corrupt('sliding entry ' .. i) -- tonumber would take " 1", "1e3"...
      end
      local t, c = tonumber(t_f), tonumber(c_f)
      if t >= F or c >= F then
        return nil
      end
      return t, c
    end
    local k = 0
    while k < n do -- expired: t + period <= now
      local t, c = entry(k)
      if not t then
        return nil
      end
      if t + period > now then
        break
      end
      sum = sum >= c and sum - c or 0
      k = k + 1
    end
    local left = n - k
    local allowed = cost <= limit and sum + cost <= limit
    local wait = ''
    if not allowed and cost <= limit then
      local need, acc = sum - (limit - cost), 0
      for i = k, n - 1 do
        local t, c = entry(i)
        if not t then
          return nil
        end
        acc = acc + c
        if acc >= need then
          wait = string.format('%d', t)
          break
        end
      end
    end
    local lt, lc
    if left > 0 then
      lt, lc = entry(n - 1)
      if not lt then
        return nil
      end
    end
    local sum_s = string.format('%d', sum)
    -- the new value is built with one concatenation (a log at its cap is tens
    -- of KB: every copy counts)
    if allowed and cost > 0 then
      local keep, e = n -- entries kept: from k up to keep - 1
      if left > 0 and (lt >= now or left >= cap) then
        if now > lt then
          lt = now
        end
        keep, e = n - 1, string.format('%020d%020d', lt, lc + cost)
      else
        lt, e = now, string.format('%020d%020d', now, cost)
        left = left + 1
      end
      put(key, '2' .. string.format('%020d', sum + cost) ..
        string.sub(s, 22 + 40 * k, 21 + 40 * keep) .. e,
        math.floor((lt + period - now) / 1000) + slack)
    elseif k > 0 and left > 0 then
      put(key, '2' .. string.format('%020d', sum) .. string.sub(s, 22 + 40 * k),
        math.floor((lt + period - now) / 1000) + slack)
    elseif k > 0 then
      del(key)
    end
    return {now_s, sum_s, allowed and 1 or 0, left,
      left > 0 and string.format('%d', lt) or '', wait}
  end

  local reply = fast()
  if reply then
    return reply
  end

  -- exact: limbs
  local nh, nl = now_limbs()
  local ch, cl = arg(4)
  local mh, ml = arg(5)
  local ph, pl = arg(6)
  local sh, sl = parse(string.sub(s, 2, 21))
  if not sh then
    corrupt('sliding sum')
  end
  local function entry(i) -- the i-th oldest entry: t, cost as limbs
    local off = 22 + 40 * i
    local th, tl = parse(string.sub(s, off, off + 19))
    local eh, el = parse(string.sub(s, off + 20, off + 39))
    -- times are at most TG_NOW_MAX_US = 9e15
    if not th or not eh or cmp(th, tl, 900000, 0) > 0 then
      corrupt('sliding entry ' .. i)
    end
    return th, tl, eh, el
  end
  local k = 0
  while k < n do -- expired: t + period <= now
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
  local body = string.sub(s, 22 + 40 * k)
  local allowed = false
  local th, tl = add(sh, sl, ch, cl)
  if th and cmp(th, tl, mh, ml) <= 0 then
    allowed = true
  end
  local changed = k > 0
  local lh, ll
  if left > 0 then
    lh, ll = entry(n - 1)
  end
  if allowed and (ch > 0 or cl > 0) then
    sh, sl = th, tl
    if left > 0 and (cmp(lh, ll, nh, nl) >= 0 or left >= cap) then
      local _, _, eh, el = entry(n - 1)
      if cmp(nh, nl, lh, ll) > 0 then
        lh, ll = nh, nl
      end
      eh, el = add(eh, el, ch, cl)
      body = string.sub(body, 1, 40 * (left - 1)) .. fmt(lh, ll, true) ..
        fmt(eh, el, true)
    else
      lh, ll = nh, nl
      body = body .. fmt(nh, nl, true) .. fmt(ch, cl, true)
      left = left + 1
    end
    changed = true
  end
  local newest = ''
  if left > 0 then
    newest = fmt(lh, ll)
  end
  if changed then
    local until_us = 0
    if left > 0 then
      local wh, wl = add(lh, ll, ph, pl)
      local dh, dl = sub(wh, wl, nh, nl)
      until_us = dh * B + dl
    end
    store(fmt(sh, sl, true), body, left, until_us)
  end
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
  return {now_s, sum, allowed and 1 or 0, left, newest, wait}
end

-- One call on one key (ops r, w, s, h, p): its reply, and the value read.
local function run(key, op, alg)
  local cur = redis.call('GET', key)
  if alg == '0' or alg == '1' then
    return window(key, op, alg, cur), cur
  elseif alg == '3' or alg == '4' then
    return bucket(key, op, alg, cur), cur
  elseif alg == '2' then
    return sliding(key, op, cur), cur
  end
  fail('TGARG algorithm')
end

-- P: a policy, decided at once (src/rules.c, as the module's TG.STEPS):
--   ARGV[2] now or "" for TIME; then per rule i (KEYS[i]) 7 arguments from
--   b = 3 + 7 (i - 1): ARGV[b] algorithm, ARGV[b+1] op (p for windows and
--   buckets, h for a sliding log), ARGV[b+2..b+5] as A[4..7] of that op
--   (windows: cost, period_ms, limit; buckets: cost * T ns, tau ns;
--   sliding: cost, limit, period_us, most entries kept), ARGV[b+6] 1 when
--   the rule's denial does not deny the call (shadow mode).
--   Every rule is checked (its writes kept, not made); the policy passes
--   when every rule allows but shadow ones, and then each rule that allowed
--   writes what it kept; nothing is written otherwise.
--   -> {now_us, the value of each key as read or "", 1 passed / 0 not}: the
--   client runs the core on those values (the same decision: a difference
--   is TG_ESTORE). A corrupt value answers "TGCORRUPT rule I ...".
if ARGV[1] == 'P' then
  local out, writes, pass, bad = {now_s}, {}, true, false
  for i = 1, #KEYS do
    local b = 3 + 7 * (i - 1)
    A = {}
    A[4], A[5], A[6], A[7] = ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
    tag = 'rule ' .. (i - 1) .. ' '
    pending, verdict = {}, nil
    local alg, op = ARGV[b], ARGV[b + 1]
    if op ~= (alg == '2' and 'h' or 'p') then
      fail('TGARG policy op')
    end
    local r, cur = run(KEYS[i], op, alg)
    out[i + 1] = cur or ''
    if alg == '2' then
      verdict = r[3] == 1
    end
    if verdict == 'bad' then
      bad = true
    elseif verdict then
      writes[#writes + 1] = pending
    elseif ARGV[b + 6] ~= '1' then
      pass = false
    end
  end
  pass = pass and not bad
  if pass then
    for _, w in ipairs(writes) do
      for _, x in ipairs(w) do
        if x[2] then
          redis.call('SET', x[1], x[2], 'PX', x[3])
        else
          redis.call('DEL', x[1])
        end
      end
    end
  end
  out[#KEYS + 2] = pass and 1 or 0
  return out
end

return (run(KEYS[1], ARGV[1], ARGV[2]))
