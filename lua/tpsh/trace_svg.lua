-- trace_svg.lua: a timeline picture of a trace, as a self-contained SVG (tp.trace.svg, --trace FILE.svg).
--
-- For a person without Perfetto: one lane per stream per rank (and one for the host's blocking calls,
-- one for the script's named spans: tp.trace.span, tp.compare's variants, and one per nesting level of
-- its ranges: tp.range; both labelled where they are wide enough), compute, communication, stream waits and host blocks in distinct colours, a time axis with round
-- ticks, a legend, and a tooltip (<title>) on every box with its name, duration and shapes. No
-- scripts, fonts or styles from outside: any browser opens it.
local capi = require "tpsh.capi"
local utf8 = require "tpsh.utf8"

local M = {}

M.colors = { compute = "#4e79a7", comm = "#f28e2b", wait = "#bab0ac", host = "#e15759", span = "#b6d7a8",
  range = "#d4a6c8" }
local order = { "compute", "comm", "wait", "host", "span", "range" }
local RANGE_LANE = -10     -- a range of depth d is drawn in lane RANGE_LANE - d

-- Text for the picture: valid UTF-8 (utf8.clean), without the control characters XML 1.0 forbids
-- (shown as U+FFFD, tab and newline as a space), the markup characters escaped.
local markup = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["\t"] = " ", ["\n"] = " ",
  ["\r"] = " " }
local function esc(s)
  return (utf8.clean(s):gsub("[&<>\"%c]", function(c) return markup[c] or utf8.REPLACEMENT end))
end

-- Characters of a UTF-8 string, and its first n (a name cut short must stay valid UTF-8 in the file).
local CHAR = "[%z\1-\127\192-\255][\128-\191]*"
local function chars(s)
  local _, n = s:gsub(CHAR, "")
  return n
end
local function first_chars(s, n)
  local out = {}
  for c in s:gmatch(CHAR) do
    if #out == n then break end
    out[#out + 1] = c
  end
  return table.concat(out)
end

-- A round tick step (1, 2 or 5 times a power of ten) giving about n ticks over span.
local function tick_step(span, n)
  local raw = span / n
  local p = 10 ^ math.floor(math.log10(raw))
  for _, m in ipairs { 1, 2, 5, 10 } do
    if m * p >= raw then return m * p end
  end
  return 10 * p
end

local function fmt_ms(t, step)
  local digits = step >= 1 and 0 or math.ceil(-math.log10(step))
  return ("%." .. digits .. "f"):format(t)
end

-- all: what trace.lua collects (by rank + 1: { rank, streams, records }); t0: the origin (ms).
-- opts: width (px, default 1200), title.
local SVG_OPTIONS = { width = true, title = true }
local MIN_WIDTH, MAX_WIDTH = 400, 100000

-- tp.trace.svg's options, checked on every rank before the trace is collected (render runs on rank 0).
function M.options(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then capi.raise("tp.trace.svg", "expected a table of options, got " .. capi.describe(opts)) end
  capi.check_options("tp.trace.svg", opts, SVG_OPTIONS)
  local width = opts.width or 1200
  if type(width) ~= "number" or width ~= math.floor(width) or width < MIN_WIDTH or width > MAX_WIDTH then
    capi.raise("tp.trace.svg", ("opts.width must be a whole number of pixels in [%d, %d], got %s"):format(
      MIN_WIDTH, MAX_WIDTH, capi.show(width)))
  end
  if opts.title ~= nil and type(opts.title) ~= "string" then
    capi.raise("tp.trace.svg", "opts.title must be a string, got " .. capi.describe(opts.title))
  end
  return opts
end

function M.render(all, t0, opts)
  opts = M.options(opts)
  local width = opts.width or 1200
  local left, right, top, lane_h, gap = 170, 20, 60, 20, 4
  -- lanes: per rank, the ranges (a lane per depth), the spans and the host (when there are any) then the
  -- streams in id order
  local lanes, t_end = {}, t0
  for _, p in ipairs(all) do
    local by_stream, has_host, has_span, depths = {}, false, false, -1
    for _, r in ipairs(p.records) do
      if r[2] > t_end then t_end = r[2] end
      if r[3] == "span" then has_span = true
      elseif r[3] == "range" then depths = math.max(depths, r[8])
      elseif r[4] < 0 then has_host = true else by_stream[r[4]] = true end
    end
    for d = 0, depths do
      lanes[#lanes + 1] = { rank = p.rank, index = RANGE_LANE - d,
        label = d == 0 and ("rank %d  ranges"):format(p.rank) or ("rank %d  ranges, level %d"):format(p.rank, d + 1) }
    end
    if has_span then lanes[#lanes + 1] = { rank = p.rank, index = -2, label = ("rank %d  spans"):format(p.rank) } end
    if has_host then lanes[#lanes + 1] = { rank = p.rank, index = -1, label = ("rank %d  host"):format(p.rank) } end
    local idx = {}
    for i in pairs(by_stream) do idx[#idx + 1] = i end
    table.sort(idx, function(a, b) return p.streams[a].id < p.streams[b].id end)
    for _, i in ipairs(idx) do
      lanes[#lanes + 1] = { rank = p.rank, index = i, label = ("rank %d  %s"):format(p.rank, p.streams[i].name) }
    end
  end
  local span = math.max(t_end - t0, 1e-3)
  local plot_w = width - left - right
  local function x(t) return left + (t - t0) / span * plot_w end
  local lane_of = {}
  for i, l in ipairs(lanes) do lane_of[l.rank .. ":" .. l.index] = i end
  local height = top + #lanes * (lane_h + gap) + 50

  local out = {}
  local function put(s) out[#out + 1] = s end
  put(('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">'):format(width, height, width, height))
  put(('<rect width="%d" height="%d" fill="white"/>'):format(width, height))
  put(('<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>'):format(left, esc(opts.title or "tpsh trace")))
  local dropped = require("tpsh.trace")._dropped_text(all)
  if dropped then        -- the trace's record limit was reached: say so where the picture is read
    put(('<text x="%d" y="40" fill="#c00">the trace was full, later records were not kept: %s</text>'):format(
      left, esc(dropped)))
  end
  -- legend
  local lx = left + 260
  for _, cat in ipairs(order) do
    put(('<rect x="%d" y="9" width="14" height="14" fill="%s"/><text x="%d" y="20">%s</text>'):format(
      lx, M.colors[cat], lx + 18, cat))
    lx = lx + 90
  end
  -- lanes, with alternating backgrounds so that a rank's streams read as a group
  for i, l in ipairs(lanes) do
    local y = top + (i - 1) * (lane_h + gap)
    if l.rank % 2 == 1 then
      put(('<rect x="0" y="%d" width="%d" height="%d" fill="#f3f3f3"/>'):format(y - gap / 2, width, lane_h + gap))
    end
    put(('<text x="8" y="%d">%s</text>'):format(y + lane_h - 6, esc(l.label)))
  end
  -- time axis: grid lines and labels in ms from the start of the trace
  local step = tick_step(span, 10)
  local axis_y = top + #lanes * (lane_h + gap) + 6
  put(('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>'):format(left, axis_y, width - right, axis_y))
  for k = 0, math.floor(span / step + 1e-9) do
    local t = k * step
    local px = x(t0 + t)
    put(('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'):format(px, top - 4, px, axis_y))
    put(('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>'):format(px, axis_y, px, axis_y + 5))
    put(('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'):format(px, axis_y + 18, fmt_ms(t, step)))
  end
  put(('<text x="%d" y="%d" text-anchor="end">ms</text>'):format(width - right, axis_y + 34))
  -- boxes: waits thinner, so that the work they wait for stays visible. Runs of boxes of one category
  -- narrower than a pixel, each starting within a pixel of the last, are drawn as one box ("N ops"):
  -- a loop of tiny ops would otherwise make a picture of megabytes that shows nothing more.
  local function box(b)
    local li = lane_of[b.rank .. ":" .. b.lane]
    local y = top + (li - 1) * (lane_h + gap)
    local thin = b.cat == "wait"
    local tip = b.n > 1 and ("%d ops (%s) in %.3f ms"):format(b.n, b.cat, b.t1 - b.t0)
      or ("%s (%s) %.3f ms%s"):format(b.name, b.cat, b.t1 - b.t0, b.args ~= "" and ("  " .. b.args) or "")
    put(('<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s" stroke="white" stroke-width="0.3">'
      .. '<title>%s</title></rect>'):format(x(b.t0), thin and y + lane_h * 0.35 or y, math.max(x(b.t1) - x(b.t0), 0.5),
      thin and lane_h * 0.3 or lane_h, M.colors[b.cat] or "#999", esc(tip)))
  end
  -- spans: the longest first, so that nested ones are drawn over the ones that hold them; ranges: in the
  -- lane of their depth. The name, cut short with an ellipsis where the box has less room
  local function span_box(rank, r)
    local range = r[3] == "range"
    local y = top + (lane_of[rank .. ":" .. (range and RANGE_LANE - r[8] or -2)] - 1) * (lane_h + gap)
    local x0, w = x(r[1]), math.max(x(r[2]) - x(r[1]), 0.5)
    put(('<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s" stroke="%s" stroke-width="0.5">'
      .. '<title>%s (%s) %.3f ms%s</title></rect>'):format(x0, y, w, lane_h, M.colors[r[3]],
      range and "#9b6a8f" or "#6a9a5b", esc(r[5]), r[3], r[2] - r[1], r[6] ~= "" and ("  " .. esc(r[6])) or ""))
    local fits = math.floor((w - 6) / 6.5)     -- characters of 12 px sans-serif that fit, about
    local label = chars(r[5]) <= fits and r[5] or fits >= 4 and first_chars(r[5], fits - 1) .. "\226\128\166" or nil
    if label then
      put(('<text x="%.1f" y="%d" pointer-events="none">%s</text>'):format(x0 + 3, y + lane_h - 6, esc(label)))
    end
  end
  local px = span / plot_w                    -- ms per pixel
  for _, p in ipairs(all) do
    local open = {}                           -- per lane: the box being grown
    local recs, spans = {}, {}
    for _, r in ipairs(p.records) do
      if r[3] == "span" or r[3] == "range" then spans[#spans + 1] = r else recs[#recs + 1] = r end
    end
    table.sort(spans, function(a, b) return a[2] - a[1] > b[2] - b[1] end)
    for _, r in ipairs(spans) do span_box(p.rank, r) end
    table.sort(recs, function(a, b) return a[1] < b[1] end)
    for _, r in ipairs(recs) do
      local lane = r[4] < 0 and -1 or r[4]
      local b = open[lane]
      local tiny = r[2] - r[1] < px
      if b and tiny and b.tiny and b.cat == r[3] and r[1] - b.t1 < px then
        b.t1, b.n = math.max(b.t1, r[2]), b.n + 1
      else
        if b then box(b) end
        open[lane] = { rank = p.rank, lane = lane, t0 = r[1], t1 = r[2], cat = r[3], name = r[5], args = r[6], n = 1,
          tiny = tiny }
      end
    end
    for _, b in pairs(open) do box(b) end
  end
  put("</svg>\n")
  return table.concat(out, "\n")
end

return M
