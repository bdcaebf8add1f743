# tests/eval_plot.gp - accuracy against context length, one line per attention mode (the mean
# over tasks of tests/eval.sh), with the model's trained context marked. tests/eval.sh runs it:
#   gnuplot -e "dat='results/eval/accuracy.dat'; png='results/eval/accuracy.png'; \
#               titles='FullAttention RetrievalAttention'; ctx=8192" tests/eval_plot.gp
# dat: column 1 the length in tokens, then one column per mode (accuracy in %, NaN when absent).

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 900,540 font "sans,11"
} else {
    set terminal png size 900,540
}
set output png
set title "Accuracy on long-context retrieval (mean over tasks)"
set xlabel "prompt length (tokens)"
set ylabel "accuracy (%)"
set logscale x 2
stats dat using 1 nooutput   # the lengths; the x range also shows the trained context
set xrange [STATS_min / 1.5 : (STATS_max > ctx ? STATS_max : ctx) * 1.5]
set yrange [0:105]
set key outside right
set grid
set datafile missing "NaN"
# the trained context: right of it, the model runs beyond what it was trained on
set arrow from ctx, graph 0 to ctx, graph 1 nohead dashtype 2 linecolor "gray40"
set label "trained context " at ctx, graph 0.05 right textcolor "gray40"
plot for [i = 1:words(titles)] dat using 1:(column(i + 1)) with linespoints linewidth 2 pointtype 7 title word(titles, i)
