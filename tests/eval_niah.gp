# tests/eval_niah.gp - needle-in-a-haystack grids, as the paper's Figure 5: for each attention
# mode the accuracy (mean over tasks and seeds, %) of each prompt length (x) and needle depth
# (y), red for 0 and green for 100. tests/eval.sh runs it:
#   gnuplot -e "dat='results/eval/niah.dat'; axes='results/eval/niah.gp'; \
#               png='results/eval/niah.png'" tests/eval_niah.gp
# dat: one block per mode of "length index, depth index, accuracy" rows (NaN when absent);
# axes sets the tics, nx, ny, titles (one word per mode) and tasks (those averaged).

load axes
n = words(titles)
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size (320 * n + 120),420 font "sans,11" noenhanced
} else {
    set terminal png size (320 * n + 120),420 noenhanced
}
set output png
set palette defined (0 "#d73027", 50 "#fee08b", 100 "#1a9850")
set cbrange [0:100]
set cblabel "accuracy (%)"
set xrange [-0.5 : nx - 0.5]
set yrange [ny - 0.5 : -0.5]   # depth 0 at the top, as the paper draws it
set xlabel "prompt length (tokens)"
set multiplot layout 1,n title sprintf("Needle in a haystack (as Figure 5): accuracy by length and needle depth (%s)", tasks)
do for [i = 1:n] {
    set title word(titles, i)
    if (i == 1) { set ylabel "needle depth" } else { unset ylabel }
    if (i < n) { unset colorbox } else { set colorbox }
    # a box a cell (an image needs a grid of 2 x 2 or more); a NaN cell (no run) stays blank
    plot dat index (i - 1) using 1:2:(0.5):(0.5):3 with boxxyerror fillstyle solid noborder fillcolor palette notitle, \
         dat index (i - 1) using 1:2:(strcol(3) eq "NaN" ? "-" : sprintf("%.0f", $3)) with labels notitle
}
unset multiplot
