#!/bin/bash
# $1 url $2 body $3 label
for c in 1 64; do
  n=$([ $c = 1 ] && echo 2000 || echo 12000)
  hey -n $n -c $c -m POST -T application/json -D $2 $1 > /tmp/proto/hey.out
  echo "$3 c=$c $(grep -E 'Requests/sec' /tmp/proto/hey.out | awk '{print $2}') rps p50 $(grep '50% in' /tmp/proto/hey.out | awk '{print $3}') p99 $(grep '99% in' /tmp/proto/hey.out | awk '{print $3}') codes $(grep -E '^\s+\[[0-9]+\]' /tmp/proto/hey.out | tr -s ' ' | tr '\n' ' ')"
done
