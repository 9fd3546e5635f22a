import Foundation

/// The Lua scripts of ``RedisSessionCoordinator``: each is one atomic step of
/// ``CoordinationRecord`` (the value the in-memory and file stores run), checked against it case
/// for case by `RedisScriptConformanceTests`.
///
/// The lease lives in its own key with a time to live (`lease`), and a copy of it in the session
/// hash (`lease`, `lease-until` by Redis's clock), which has none: a `volatile-*` eviction of the
/// key forgets nothing, and a lease is only lost with the session itself (then the fleet
/// re-seeds, with a quarantine).
///
/// Announcements on the channel (JSON, sealed under a key by the process that sends them):
/// `{"t":"c","g":gen,"e":epoch,"f":fence,"c":creds}` a publication, re-seed or sign-in;
/// `{"t":"g","f":fence,"g":gen,"l":ms,"v":value}` a lease granted or put back (every process
/// remembers it, and honours it for its term should Redis forget it); `{"t":"e","f":fence}` a
/// lease given back; `{"t":"f","f":fence,"w":why}` a failed refresh; `{"t":"r","u":ms,"w":why}`
/// the token endpoint's `Retry-After` a holder was given (no process calls it before `u`);
/// `{"t":"l",…}` a logout.
extension RedisSessionCoordinator {
    /// KEYS: session, logout, lease, fence. ARGV: credentials JSON (or empty), the generation they
    /// have, the session epoch (sealed under a key; empty when none), the lease to put back (its
    /// value, empty for none), its milliseconds, the fencing token floor, the channel.
    ///
    /// Seeds the session when Redis holds none, or an older generation than the seed (it forgot,
    /// or was put back: ``CoordinationRecord/reseed(_:now:)``): the later epoch is kept, the fencing
    /// counter goes past the floor, the lease is put back unless one is held (and announced), and
    /// the session is announced. Returns {1} when it seeded, else {0, gen, creds, logout-until, epoch}.
    static let seedScript = """
        local gen = redis.call('HGET', KEYS[1], 'gen')
        local creds = redis.call('HGET', KEYS[1], 'creds')
        local mine = tonumber(ARGV[2]) or 0
        if ARGV[1] ~= '' and (not creds or not gen or (tonumber(gen) or 0) < mine) then
          local new = math.max(tonumber(gen or '0') or 0, mine)
          redis.call('HSET', KEYS[1], 'gen', tostring(new), 'creds', ARGV[1])
          local had = redis.call('HGET', KEYS[1], 'epoch') or ''
          local epoch = ARGV[3] or ''
          if epoch ~= '' and (tonumber(string.match(epoch, '^%d+') or '0') or 0) >=
              (tonumber(string.match(had, '^%d+') or '0') or 0) then
            redis.call('HSET', KEYS[1], 'epoch', epoch)
          end
          local counter = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
          local floor = tonumber(ARGV[6] or '0') or 0
          if counter < floor then
            redis.call('SET', KEYS[4], tostring(floor))
            counter = floor
          end
          local lease = ARGV[4] or ''
          if lease ~= '' and redis.call('EXISTS', KEYS[3]) == 0 then
            local t = redis.call('TIME')
            local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            redis.call('SET', KEYS[3], lease, 'PX', ARGV[5])
            redis.call('HSET', KEYS[1], 'lease', lease, 'lease-until', tostring(now + tonumber(ARGV[5])))
            redis.call('HDEL', KEYS[1], 'lease-asker')
            local fence = tonumber(string.match(lease, '^%d+') or '0') or 0
            if counter < fence then redis.call('SET', KEYS[4], tostring(fence)) end
            if (ARGV[7] or '') ~= '' and string.match(lease, '^[%w:.]+$') then
              redis.call('PUBLISH', ARGV[7],
                '{"t":"g","f":' .. fence .. ',"g":' .. new .. ',"l":' .. ARGV[5] .. ',"v":"' .. lease .. '"}')
            end
          end
          if (ARGV[7] or '') ~= '' then
            local stored = redis.call('HGET', KEYS[1], 'epoch') or ''
            if not string.match(stored, '^[%w:.]+$') then stored = '' else stored = ',"e":"' .. stored .. '"' end
            redis.call('PUBLISH', ARGV[7], '{"t":"c","g":' .. new .. stored .. ',"c":' .. ARGV[1] .. '}')
          end
          return {1}
        end
        return {0, gen or '0', creds or '', redis.call('GET', KEYS[2]) or '0',
          redis.call('HGET', KEYS[1], 'epoch') or ''}
        """

    /// KEYS: session, lease, fence, logout, loops. ARGV: failed generation, lease ms, limit
    /// count (0: none; given only by a process that saw that generation's token refused), limit
    /// window ms; under a key, the fencing token asked for and the lease's sealed suffix (empty
    /// without one); the newest generation the asking process knows, the highest fencing token it
    /// has seen, a lease it saw in term (its value, or empty) and its ms left, the channel grants
    /// are announced on, the asking coordinator's id (random), `1` when the asking process holds a
    /// pair (a session with no credentials then forgot it), the loop member to count (under a key
    /// `<gen>:<ms>:<seal>`; empty: the generation), a `retry-after` value the process refused
    /// (forged: removed), and the longest embargo ms.
    ///
    /// Returns {5, gen} (Redis is behind what the process knows: it re-seeds, then asks again),
    /// {0, gen, creds, logout-until, epoch} (newer), {2, holder lease, ms left} (wait: a lease held,
    /// or the one the process saw put back), {6, retry-after, why} (the token endpoint asked a
    /// holder to wait: no lease before then), {3, loops…} (limit reached), {4, counter} (the
    /// token asked for is not past the counter: ask again), {1, fence, gen, ms left} (granted and
    /// announced; or its own lease again, granted to a question whose answer it never got).
    ///
    /// `refresh.limit` (``CoordinationRecord``): a question with a limit on the newest generation,
    /// made by a refresh (past the session epoch) and accepted by no process (`accepted` in the
    /// session hash), counts that generation once (a member of the loops set, scored by time).
    static let beginScript = """
        local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') or 0
        if gen < (tonumber(ARGV[7] or '0') or 0)
            or ((ARGV[13] or '') == '1' and not redis.call('HGET', KEYS[1], 'creds')) then
          return {5, tostring(gen)}
        end
        if gen > tonumber(ARGV[1]) then
          return {0, tostring(gen), redis.call('HGET', KEYS[1], 'creds') or '', redis.call('GET', KEYS[4]) or '0',
            redis.call('HGET', KEYS[1], 'epoch') or ''}
        end
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        -- refresh.limit: the trigger is evidence whoever refreshes, counted before any lease.
        local count = tonumber(ARGV[3])
        local loop = false
        if count > 0 then
          redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[4]))
          local epoch = tonumber(string.match(redis.call('HGET', KEYS[1], 'epoch') or '', '^%d+') or '0') or 0
          local accepted = tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0') or 0
          if tonumber(ARGV[1]) == gen and gen > epoch and gen > accepted then
            loop = true
            local counted = false
            for _, member in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
              if string.match(member, '^[^:]*') == tostring(gen) then counted = true end
            end
            if not counted then
              local member = ARGV[14] or ''
              if member == '' then member = tostring(gen) end
              redis.call('ZADD', KEYS[5], now, member)
              redis.call('PEXPIRE', KEYS[5], ARGV[4])
            end
          end
        end
        local holder = redis.call('GET', KEYS[2])
        if not holder then
          -- The lease key was evicted (volatile-*) while the session hash (no time to live) kept
          -- its copy: put back for what is left of it.
          local mirror = redis.call('HGET', KEYS[1], 'lease')
          local untilMs = tonumber(redis.call('HGET', KEYS[1], 'lease-until') or '0') or 0
          if mirror and untilMs > now then
            redis.call('SET', KEYS[2], mirror, 'PX', untilMs - now)
            holder = mirror
          end
        end
        if holder then
          -- Its own lease, granted to a question whose answer it never got (its client gave up
          -- after Redis ran it): granted again for what is left of it, rather than waited for.
          local asker = ARGV[12] or ''
          local fence = tonumber(string.match(holder, '^%d+') or '0') or 0
          if asker ~= '' and fence > 0 and redis.call('HGET', KEYS[1], 'lease-asker') == asker
              and redis.call('HGET', KEYS[1], 'lease') == holder then
            return {1, tostring(fence), tostring(gen), redis.call('PTTL', KEYS[2])}
          end
          local left = redis.call('PTTL', KEYS[2])
          if left < 0 or left > tonumber(ARGV[2]) then
            redis.call('PEXPIRE', KEYS[2], ARGV[2])
            left = tonumber(ARGV[2])
            if redis.call('HGET', KEYS[1], 'lease') == holder then
              redis.call('HSET', KEYS[1], 'lease-until', tostring(now + left))
            end
          end
          return {2, holder, left}
        end
        local counter = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
        local known = ARGV[9] or ''
        local knownLeft = tonumber(ARGV[10] or '0') or 0
        if known ~= '' and knownLeft > 0 then
          local fence = tonumber(string.match(known, '^%d+') or '0') or 0
          if fence >= counter then
            local left = math.min(knownLeft, tonumber(ARGV[2]))
            redis.call('SET', KEYS[2], known, 'PX', left)
            redis.call('HSET', KEYS[1], 'lease', known, 'lease-until', tostring(now + left))
            redis.call('HDEL', KEYS[1], 'lease-asker')
            if fence > counter then redis.call('SET', KEYS[3], tostring(fence)) end
            return {2, known, left}
          end
        end
        local embargo = redis.call('HGET', KEYS[1], 'retry-after')
        if embargo and (ARGV[15] or '') ~= '' and embargo == ARGV[15] then
          redis.call('HDEL', KEYS[1], 'retry-after', 'retry-after-why')
        elseif embargo then
          local untilMs = tonumber(string.match(embargo, '^%d+') or '0') or 0
          if untilMs > now then
            local longest = tonumber(ARGV[16] or '0') or 0
            if longest > 0 and untilMs - now > longest and not string.find(embargo, ':', 1, true) then
              embargo = tostring(now + longest)
              redis.call('HSET', KEYS[1], 'retry-after', embargo)
            end
            return {6, embargo, redis.call('HGET', KEYS[1], 'retry-after-why') or ''}
          end
        end
        if loop and redis.call('ZCARD', KEYS[5]) >= count then
          return {3, unpack(redis.call('ZRANGE', KEYS[5], 0, count - 1))}
        end
        local fence
        if (ARGV[5] or '') ~= '' then
          if counter >= tonumber(ARGV[5]) then return {4, tostring(counter)} end
          redis.call('SET', KEYS[3], ARGV[5])
          fence = ARGV[5]
        else
          fence = tostring(math.max(counter, tonumber(ARGV[8] or '0') or 0) + 1)
          redis.call('SET', KEYS[3], fence)
        end
        local value = fence .. (ARGV[6] or '')
        redis.call('SET', KEYS[2], value, 'PX', ARGV[2])
        redis.call('HSET', KEYS[1], 'lease', value, 'lease-until', tostring(now + tonumber(ARGV[2])),
          'lease-asker', ARGV[12] or '')
        if (ARGV[11] or '') ~= '' then
          redis.call('PUBLISH', ARGV[11],
            '{"t":"g","f":' .. fence .. ',"g":' .. gen .. ',"l":' .. ARGV[2] .. ',"v":"' .. value .. '"}')
        end
        return {1, fence, tostring(gen), tonumber(ARGV[2])}
        """

    /// KEYS: session, lease, fence. ARGV: fence, generation the lease started from, credentials
    /// JSON, channel. Stores when nobody published since the lease was granted (the stored
    /// generation is the lease's, or older: Redis forgot), whether the lease still holds or not
    /// (``CoordinationRecord/publish(_:with:now:)``), drops any lease on the older generation and
    /// announces the session epoch stored in the hash (`e`) and the lease it ends (`f`). The same
    /// tokens published again (a retry whose first answer was lost) are answered as stored.
    /// Returns {1, gen, epoch} when stored (or already stored), {0, gen, creds, epoch} when refused.
    static let publishScript = """
        local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') or 0
        local base = tonumber(ARGV[2])
        if gen > base then
          local creds = redis.call('HGET', KEYS[1], 'creds') or ''
          if gen == base + 1 then
            local ok, stored = pcall(cjson.decode, creds)
            local ok2, mine = pcall(cjson.decode, ARGV[3])
            if ok and ok2 and type(stored) == 'table' and type(mine) == 'table'
                and stored.access_token == mine.access_token and stored.refresh_token == mine.refresh_token then
              return {1, tostring(gen), redis.call('HGET', KEYS[1], 'epoch') or ''}
            end
          end
          return {0, tostring(gen), creds, redis.call('HGET', KEYS[1], 'epoch') or ''}
        end
        local new = base + 1
        redis.call('HSET', KEYS[1], 'gen', tostring(new), 'creds', ARGV[3])
        redis.call('HDEL', KEYS[1], 'lease', 'lease-until', 'lease-asker')
        redis.call('DEL', KEYS[2])
        local stored = redis.call('HGET', KEYS[1], 'epoch') or ''
        local epoch = stored
        if not string.match(epoch, '^[%w:.]+$') then epoch = '' else epoch = ',"e":"' .. epoch .. '"' end
        redis.call('PUBLISH', ARGV[4], '{"t":"c","g":' .. new .. epoch .. ',"f":' .. ARGV[1] .. ',"c":' .. ARGV[3] .. '}')
        return {1, tostring(new), stored}
        """

    /// KEYS: lease, session. ARGV: fence, the announcement (a failure `{"t":"f",…}` or the lease's
    /// end `{"t":"e",…}`; empty for none), channel; and when the token endpoint asked to wait, the
    /// end of that wait (`retry-after`: ms since 1970, under a key `<ms>:<seal>`), its reason and
    /// its announcement `{"t":"r",…}`. Releases the lease (and its copy in the session hash) when
    /// it is this one; stores the wait in the session hash when it ends later than the one held
    /// (``CoordinationRecord/end(_:failure:retryAfter:now:)``), and announces it.
    static let endScript = """
        local held = redis.call('GET', KEYS[1])
        if held and string.match(held, '^[^:]*') == ARGV[1] then redis.call('DEL', KEYS[1]) end
        local mirror = redis.call('HGET', KEYS[2], 'lease')
        if mirror and string.match(mirror, '^[^:]*') == ARGV[1] then redis.call('HDEL', KEYS[2], 'lease', 'lease-until', 'lease-asker') end
        if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[2]) end
        if (ARGV[4] or '') ~= '' then
          local t = redis.call('TIME')
          local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
          local new = tonumber(string.match(ARGV[4], '^%d+') or '0') or 0
          local had = tonumber(string.match(redis.call('HGET', KEYS[2], 'retry-after') or '', '^%d+') or '0') or 0
          if had <= now then had = 0 end
          if new > now and new > had then
            redis.call('HSET', KEYS[2], 'retry-after', ARGV[4], 'retry-after-why', ARGV[5] or '')
            if (ARGV[6] or '') ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[6]) end
          end
        end
        return 1
        """

    /// KEYS: session, loops. ARGV: the generation whose token a response accepted. When Redis holds
    /// it (or a later one), it is never counted by `refresh.limit`: `accepted` in the session hash
    /// goes up to it, and a loop counted for it is dropped (``CoordinationRecord/accept(_:)``).
    /// Returns 1 when it changed anything.
    static let acceptScript = """
        local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') or 0
        local seen = tonumber(ARGV[1]) or 0
        if seen > gen then return 0 end
        local changed = 0
        for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
          if string.match(member, '^[^:]*') == tostring(seen) then
            redis.call('ZREM', KEYS[2], member)
            changed = 1
          end
        end
        if seen > (tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0') or 0) then
          redis.call('HSET', KEYS[1], 'accepted', tostring(seen))
          changed = 1
        end
        return changed
        """

    /// KEYS: logout, session. ARGV: until ms, ttl ms, message, channel, under a key the end's
    /// session epoch and seal (`:<epoch>:<seal>`, stored after the number; empty without one),
    /// and the session epoch the logout was decided in (the epoch of the token its request was
    /// signed with).
    /// A logout decided in an epoch older than the session hash's (on the old session's token, or
    /// by a process that had not heard of the sign-in that started it) ended only the session that
    /// sign-in ended: it is neither stored nor announced, and the reply is {0, stored epoch}.
    /// Otherwise it stores before it announces, never shortens a longer cooldown, and replies {1}.
    static let logoutScript = """
        if (ARGV[6] or '') ~= '' then
          local epoch = redis.call('HGET', KEYS[2], 'epoch') or ''
          if tonumber(ARGV[6]) < (tonumber(string.match(epoch, '^%d+') or '0') or 0) then return {0, epoch} end
        end
        local current = tonumber(string.match(redis.call('GET', KEYS[1]) or '0', '^%d*') or '0') or 0
        if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1] .. (ARGV[5] or ''), 'PX', ARGV[2]) end
        redis.call('PUBLISH', ARGV[4], ARGV[3])
        return {1}
        """

    /// KEYS: session, lease, logout. ARGV: credentials JSON, channel, the generation the signing
    /// process knows (under a key the credentials are sealed after it, and the script answers
    /// {gen} when Redis holds a later one: ask again), and under a key the sealed session epoch
    /// the sign-in starts. The sign-in's generation goes past both what Redis holds and what the
    /// process knows (a Redis that forgot never numbers it backwards). The epoch (without a key:
    /// the new generation, unsealed) is stored in the hash's `epoch` and announced as `e`. Ends a
    /// cooldown and voids a refresh in progress (its holder's publication is refused).
    static let signInScript = """
        local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') or 0
        local known = tonumber(ARGV[3] or '') or 0
        if (ARGV[4] or '') ~= '' and gen > known then return {tostring(gen)} end
        local new = math.max(gen, known) + 1
        redis.call('HSET', KEYS[1], 'gen', tostring(new), 'creds', ARGV[1])
        redis.call('HDEL', KEYS[1], 'lease', 'lease-until', 'lease-asker', 'retry-after', 'retry-after-why')
        redis.call('DEL', KEYS[2], KEYS[3])
        local epoch = ARGV[4] or ''
        if epoch == '' then epoch = tostring(new) end
        redis.call('HSET', KEYS[1], 'epoch', epoch)
        epoch = ',"e":"' .. epoch .. '"'
        redis.call('PUBLISH', ARGV[2], '{"t":"c","g":' .. new .. epoch .. ',"c":' .. ARGV[1] .. '}')
        return new
        """
}
