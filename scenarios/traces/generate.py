#!/usr/bin/env python3
"""Writes bursty-day.csv: a small synthetic arrival trace in BurstGPT's
6-column CSV layout (Timestamp, Model, Request tokens, Response tokens,
Total tokens, Log Type), for the replayed-trace scenario.

Ten minutes of traffic: a base rate of 0.5 requests/s that rises to 2/s for
a burst between 240 s and 330 s, with lognormal prompt and response lengths
and about 2 % of rows recorded as failures (Response tokens = 0), as BurstGPT
marks them. Seeded, so running it again writes the same file:

    python3 scenarios/traces/generate.py > scenarios/traces/bursty-day.csv
"""
import math
import random

rng = random.Random(20261203)
print("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type")
t = 0.0
while True:
    rate = 2.0 if 240.0 <= t < 330.0 else 0.5
    t += rng.expovariate(rate)
    if t >= 600.0:
        break
    prompt = max(1, round(rng.lognormvariate(math.log(400), 0.8)))
    response = max(1, round(rng.lognormvariate(math.log(80), 0.6)))
    if rng.random() < 0.02:
        response = 0
    print(f"{t:.3f},ChatGPT,{prompt},{response},{prompt + response},Conversation log")
