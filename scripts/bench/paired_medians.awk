# paired_medians.awk: one CSV of bench_collectives.lua --ref --ref-event in, one line per collective
# out (in the file's order): "collective tpsh/C tpsh/(C+end event) C-us-at-1-KiB", the ratios the
# medians of every round's ratio over the sizes up to 4 KiB (round_ratios, round_ratios_event), the
# C loop's time its best at 1 KiB. For ab_collectives.sh and diag_memory_pressure.sh.
#   awk -F, -f scripts/bench/paired_medians.awk FILE.csv
function median(s,   x, m, i, j, t) {
  m = split(s, x, " ")
  for (i = 2; i <= m; i++) { t = x[i] + 0; for (j = i - 1; j >= 1 && x[j] + 0 > t; j--) x[j + 1] = x[j]; x[j + 1] = t }
  return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
}
NR > 1 && $2 <= 4096 {
  c = $1
  if (!(c in r)) order[++n] = c
  k = split($12, a, ";"); for (j = 1; j <= k; j++) r[c] = r[c] " " a[j]
  k = split($15, b, ";"); for (j = 1; j <= k; j++) e[c] = e[c] " " b[j]
  if ($2 == 1024) t[c] = $9
}
END { for (i = 1; i <= n; i++) { c = order[i]; printf "%s %.3f %.3f %.2f\n", c, median(r[c]), median(e[c]), t[c] } }
