# tests/models/kiln_train_deepspeed_check.cmake: kiln-train --deepspeed-config (kiln::Engine) on 2
# ranks against the data-parallel run it must equal, and stopped and resumed against itself.
#   1. ZeRO stage 3, SGD, micro-batches of 8 accumulated 2 at a time, equals DDP with batches of 16
#      per rank: every logged loss and test loss within 1e-5 relative (the same arithmetic, summed
#      in another order).
#   2. The stage 3 run stopped at step 30 (mid-epoch) and resumed equals it straight through, bit
#      for bit: the final weights' file and every logged loss.
#   3. That checkpoint (at an epoch's end) resumed on 1 rank (the ZeRO shards cut anew) trains on;
#      the one of step 30, mid-epoch, is an Error there.
#   4. bf16 at stage 2 learns (test accuracy >= 0.9 on the synthetic classes).
#   5. A flag that the config sets, and a config with a misspelt key, are Errors.
#   cmake -DPROGRAM=<kiln-train> -DLAUNCHER="kiln-run;-n;2" -DWORK=<dir> -P kiln_train_deepspeed_check.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/zero3.json [=[{
  "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
  "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": 20000, "stage3_param_persistence_threshold": 100,
                        "stage3_prefetch_bucket_size": 100000}
}]=])
file(WRITE ${WORK}/bf16.json [=[{
  "train_batch_size": 32, "steps_per_print": 1000, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2}
}]=])
set(data --dataset synthetic --model mlp --limit-train 1280 --limit-test 320 --threads 1 --quiet)

include(${CMAKE_CURRENT_LIST_DIR}/train_check.cmake)

# 1. The engine at stage 3 with accumulation equals DDP.
run_program(out "${LAUNCHER}" ${data} --epochs 2 --deepspeed-config ${WORK}/zero3.json --out ${WORK}/zero3)
run_program(out "${LAUNCHER}" ${data} --epochs 2 --optimizer sgd --lr 0.05 --momentum 0.9 --batch-size 16 --out ${WORK}/ddp)
losses(engine ${WORK}/zero3/metrics.jsonl)
losses(ddp ${WORK}/ddp/metrics.jsonl)
list(LENGTH engine n)
if(NOT n EQUAL 10)  # 80 steps: 8 step lines and 2 epoch lines
  message(FATAL_ERROR "expected 10 losses in the metrics file, got ${n}")
endif()
check_losses_close("${engine}" "${ddp}" "the engine's" "DDP's")
if(NOT EXISTS ${WORK}/zero3/checkpoint-engine/step80/zero_rank_1.safetensors)
  message(FATAL_ERROR "no ZeRO shard of rank 1 in ${WORK}/zero3/checkpoint-engine/step80")
endif()

# 2. Stopped at step 30 and resumed: bit for bit the run straight through.
run_program(out "${LAUNCHER}" ${data} --epochs 2 --max-steps 30 --deepspeed-config ${WORK}/zero3.json --out ${WORK}/stopped)
# Mid-epoch, the data's position is per rank: on 1 rank the checkpoint of step 30 is an Error.
execute_process(COMMAND ${PROGRAM} --resume ${WORK}/stopped/checkpoint --quiet --out ${WORK}/stopped
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "saved in the middle of an epoch on 2 ranks; resume it on 2")
  message(FATAL_ERROR "a mid-epoch checkpoint resumed on another number of ranks should be an Error, got ${rc}:\n${err}")
endif()
run_program(out "${LAUNCHER}" --resume ${WORK}/stopped/checkpoint --threads 1 --quiet --out ${WORK}/stopped)
file(SHA256 ${WORK}/zero3/checkpoint/model.safetensors a)
file(SHA256 ${WORK}/stopped/checkpoint/model.safetensors b)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "resumed and straight through, the final weights differ")
endif()
losses(resumed ${WORK}/stopped/metrics.jsonl)
if(NOT resumed STREQUAL engine)
  message(FATAL_ERROR "resumed: ${resumed}\nstraight through: ${engine}")
endif()
if(EXISTS ${WORK}/stopped/checkpoint-engine/step30)
  message(FATAL_ERROR "the engine checkpoint of step 30 should be gone once checkpoint/ is at step 80")
endif()

# 3. On one rank: 16 samples a step there, so 80 more steps make the third epoch.
execute_process(COMMAND ${PROGRAM} --resume ${WORK}/stopped/checkpoint --epochs 3 --threads 1 --out ${WORK}/stopped
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "ZeRO stage 3.*resumed at step 80" OR NOT out MATCHES "kiln-train: 160 steps")
  message(FATAL_ERROR "the checkpoint should resume on 1 rank and train 80 steps more (${rc}):\n${out}\n${err}")
endif()

# 4. bf16 learns.
execute_process(COMMAND ${LAUNCHER} ${PROGRAM} --dataset synthetic --model mlp --limit-train 1280 --limit-test 320
                        --threads 1 --deepspeed-config ${WORK}/bf16.json --out ${WORK}/bf16
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "ZeRO stage 2, ZeRO-2[(]AdamW[)] lr 0.001, bfloat16, micro-batch 16 x accumulation 1"
   OR NOT out MATCHES "test accuracy (0[.]9|1[.]0)")
  message(FATAL_ERROR "bf16 under the engine should learn the synthetic classes (${rc}):\n${out}\n${err}")
endif()

# 5. Errors.
execute_process(COMMAND ${PROGRAM} ${data} --deepspeed-config ${WORK}/zero3.json --lr 0.1 --out ${WORK}/conflict
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--lr and a DeepSpeed config are both given")
  message(FATAL_ERROR "--lr with --deepspeed-config should be an Error, got ${rc}:\n${err}")
endif()
file(WRITE ${WORK}/typo.json [=[{"train_batch_size": 16, "zero_optimisation": {"stage": 2}}]=])
execute_process(COMMAND ${PROGRAM} ${data} --deepspeed-config ${WORK}/typo.json --out ${WORK}/typo
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "typo.json: \"zero_optimisation\" is not a key Kiln knows here [(]did you mean \"zero_optimization\"")
  message(FATAL_ERROR "a misspelt key should be an Error naming it, got ${rc}:\n${err}")
endif()
file(WRITE ${WORK}/curriculum.json [=[{"train_batch_size": 16, "curriculum_learning": {"enabled": true,
  "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
  "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}}}]=])
execute_process(COMMAND ${PROGRAM} ${data} --deepspeed-config ${WORK}/curriculum.json --out ${WORK}/curriculum
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "enables curriculum_learning, whose seqlen cuts dim 1")
  message(FATAL_ERROR "curriculum_learning should be refused by kiln-train, got ${rc}:\n${err}")
endif()
