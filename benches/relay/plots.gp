# Plots of one benchmark run; scripts/bench calls this with dir='...' (the run's output folder).
# Inputs there: inflight.tsv, inflight0.tsv, latency_cdf.tsv and plot_vars.gp, all written by
# the benchmark.

load dir.'/plot_vars.gp'

set terminal pngcairo size 900,620 enhanced font 'DejaVu Sans,11'
set grid lc rgb '#dddddd'
set key below box spacing 1.2
set bmargin 9

set output dir.'/throughput-vs-inflight.png'
set title sprintf('Drain throughput vs. SendMessageBatch requests in flight (sink answers after 15 ms, batch %d)', batch)
set xlabel '--max-in-flight'
set ylabel 'events/s'
set logscale x 2
set xrange [0.8:80]
set yrange [0:*]
set format y '%.0f'
plot dir.'/inflight.tsv' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'relay, 1 replica', \
     '' using 1:3 with lines dt 2 lw 1.5 lc rgb '#888888' title 'latency bound: in-flight × 10 / 15 ms', \
     ceiling1 with lines lw 2 lc rgb '#d62728' title sprintf('database ceiling, 1 connection: %.0f/s', ceiling1), \
     ceiling4 with lines dt 4 lw 2 lc rgb '#ff7f0e' title sprintf('database ceiling, 4 connections: %.0f/s', ceiling4), \
     dir.'/inflight0.tsv' using 1:2 with linespoints lw 2 pt 5 lc rgb '#2ca02c' title 'relay, 1 replica, sink answering at once'

unset logscale x
set bmargin
set key default
set output dir.'/latency-cdf.png'
set title 'Commit-to-send latency, steady producers (one relay, sink 0 ms)'
set xlabel 'milliseconds from COMMIT returning to the SendMessageBatch request arriving (log scale)'
set ylabel 'fraction of events'
set logscale x 10
set xrange [0.1:*]
set yrange [0:1]
set format y '%.1f'
set format x '%g'
set key inside bottom right box opaque
colors = '#1f77b4 #ff7f0e #2ca02c #d62728'
plot for [i=0:steady_blocks-1] dir.'/latency_cdf.tsv' index i using 1:2 with lines lw 2 \
     lc rgb word(colors, i+1) title value(sprintf('steady_title%d', i))
