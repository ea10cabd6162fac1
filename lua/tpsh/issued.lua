-- tpsh.issued: what each rank has issued on each of its groups (the collectives every member issues,
-- sends and receives aside), and how the ranks' records compare. The test runner compares them after
-- every test, the interactive session after every command: a collective that not every member called
-- waits for the others and pairs every later one on its group with the wrong call, and one that the
-- members called differently (a reduce op, a root; NCCL an all_reduce against a reduce) may complete
-- with results not to be trusted. Neither needs check mode; check mode names the call at the call.
local ffi = require "ffi"

local M = {}
local insert = table.insert
local C = ffi.C

-- This rank's record: group.c's "id world-ranks count digest failures" line per group, or nil where the
-- core's functions are not there.
local have = pcall(function() return C.tpsh_groups_collectives_text, C.tpsh_free_buffer end)
-- A buffer from the core as a Lua string (nil for NULL), the buffer freed.
local function taken(p)
  if p == nil then return nil end
  local text = ffi.string(p)
  C.tpsh_free_buffer(p)
  return text
end
function M.mine() return have and taken(C.tpsh_groups_collectives_text()) or nil end

-- A group's digest (hex) as LuaJIT's uint64_t, whose arithmetic wraps as C's.
local TWO32 = ffi.cast("uint64_t", 4294967296)
local function digest_of(hex) return TWO32 * tonumber(hex:sub(1, 8), 16) + tonumber(hex:sub(9), 16) end

-- Every rank's record (all[r + 1].colls: rank r's, as M.mine returned it; the runner and the session
-- gather one table per rank), by group, sorted by id:
-- { key =, id =, ranks = "0,1,2", members = {0, 1, 2}, n = { [rank] = count }, d = { [rank] = digest },
--   f = { [rank] = failures } }. A member that lists no line for a group has issued nothing on it.
function M.listed(all)
  local per, keys = {}, {}
  for r = 1, #all do
    for id, ranks, n, hex, f in tostring(all[r].colls or ""):gmatch("(%d+) ([%d,]+) (%d+) (%x+) (%d+)\n") do
      local k = id .. " " .. ranks
      if not per[k] then
        local members = {}
        for m in ranks:gmatch("%d+") do insert(members, tonumber(m)) end
        per[k] = { key = k, id = id, ranks = ranks, members = members, n = {}, d = {}, f = {} }
        insert(keys, k)
      end
      per[k].n[r - 1], per[k].d[r - 1], per[k].f[r - 1] = tonumber(n), digest_of(hex), tonumber(f)
    end
  end
  table.sort(keys, function(a, b)
    local ia, ib = tonumber(a:match("^%d+")), tonumber(b:match("^%d+"))
    if ia ~= ib then return ia < ib end
    return a < b
  end)
  for i, k in ipairs(keys) do keys[i] = per[k] end
  return keys
end

-- The groups whose members have issued different numbers of collectives: { group, counts = {[rank]=n} }
-- each, or nil.
function M.uneven(groups)
  local found = {}
  for _, gr in ipairs(groups) do
    local first, differ = nil, false
    for _, m in ipairs(gr.members) do
      local n = gr.n[m] or 0
      first = first or n
      differ = differ or n ~= first
    end
    if differ then insert(found, gr) end
  end
  return #found > 0 and found or nil
end

-- "rank 0 1, rank 1 0": a group's counts, member by member.
function M.counts_text(gr)
  local parts = {}
  for _, m in ipairs(gr.members) do insert(parts, ("rank %d %d"):format(m, gr.n[m] or 0)) end
  return table.concat(parts, ", ")
end

-- The groups whose members issued different collectives since the last call (a digest is a sum of one
-- hash per collective, so the difference of a rank's digests covers what it issued in between,
-- src/core/check.h). A member on which a collective of the group failed in between is left out: the
-- transport told it, and a test of that failure differs on purpose. skip[group key]: groups not to
-- compare now (their counts differ), whose record stays as it was, so that the next comparison covers
-- what they issued since. seen[group key]: the last comparison's digests and failures per rank, updated
-- here. Returns { group, a = rank, b = rank } each (a and b: two members whose collectives differ), or nil.
function M.different(groups, seen, skip)
  local found = {}
  for _, gr in ipairs(groups) do
    if not (skip and skip[gr.key]) then
      local was = seen[gr.key] or { d = {}, f = {} }
      local a, da, b
      for _, m in ipairs(gr.members) do
        local now, f = gr.d[m] or 0ULL, gr.f[m] or 0
        if f == (was.f[m] or 0) then
          local delta = now - (was.d[m] or 0ULL)
          if not a then a, da = m, delta elseif delta ~= da and not b then b = m end
        end
        was.d[m], was.f[m] = now, f
      end
      seen[gr.key] = was
      if b then insert(found, { group = gr, a = a, b = b }) end
    end
  end
  return #found > 0 and found or nil
end

-- ==== sends and receives ==========================================================================
-- This rank's sends and receives per peer: p2p_ledger.c's "peer sent groups received groups" lines, or
-- nil where the core's function is not there.
local have_p2p = pcall(function() return C.tpsh_p2p_ledger_text end)
function M.p2p_mine() return have_p2p and taken(C.tpsh_p2p_ledger_text()) or nil end

-- The pairs of ranks whose sends and receives disagree since the last call: all[r + 1].p2p is rank r's
-- record (M.p2p_mine); seen holds the last call's, updated here. A send meets the receive of its peer
-- on its own group, so for each sender a and receiver b, what a sent to b since then must be what b
-- received from a, in number and in the digest of their groups. Returns { from =, to =, sent =,
-- received =, groups = true where only the groups differ } each, in order, or nil.
function M.p2p_unmatched(all, seen)
  local now = {}           -- now[a][b] = { sn, sg, rn, rg }: rank a's counts with peer b
  for r = 1, #all do
    local per = {}
    for peer, sn, sg, rn, rg in tostring(all[r].p2p or ""):gmatch("(%d+) (%d+) (%x+) (%d+) (%x+)\n") do
      per[tonumber(peer)] = { tonumber(sn), digest_of(sg), tonumber(rn), digest_of(rg) }
    end
    now[r - 1] = per
  end
  local zero = { 0, 0ULL, 0, 0ULL }
  local function at(t, a, b) return t[a] and t[a][b] or zero end
  local found = {}
  for a = 0, #all - 1 do
    for b = 0, #all - 1 do
      local s, s0 = at(now, a, b), at(seen, a, b)          -- a's sends to b
      local r, r0 = at(now, b, a), at(seen, b, a)          -- b's receives from a
      local sent, received = s[1] - s0[1], r[3] - r0[3]
      if sent ~= received or s[2] - s0[2] ~= r[4] - r0[4] then
        insert(found, { from = a, to = b, sent = sent, received = received, groups = sent == received })
      end
    end
  end
  for a, per in pairs(now) do seen[a] = per end
  return #found > 0 and found or nil
end

return M
