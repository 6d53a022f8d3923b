# tests/models/gpt_deepspeed_check.cmake: train_gpt --deepspeed-config (kiln::Engine: ZeRO stage 3,
# fp16 with loss scaling, accumulation, clipping) on 2 ranks, stopped and resumed, equals one run
# straight through, bit for bit: 3 steps, save, resume to 6 == 6 steps, the final weights' file
# included. On windows of 2 bytes the float16 gradients of a tiny model overflow at the first scale,
# so steps are skipped before the stop. Then the same checkpoint on 1 rank (its ZeRO shards cut
# anew), a flag that the config sets (an Error) and a config with a misspelt key (an Error).
#   cmake -DPROGRAM=<train_gpt> -DLAUNCHER="kiln-run;-n;2" -DWORK=<dir> -P gpt_deepspeed_check.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/train_check.cmake)
write_test_corpus(${WORK}/corpus.txt)
file(WRITE ${WORK}/ds.json [=[{
  "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
  "steps_per_print": 1000,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
  "fp16": {"enabled": true, "loss_scale_window": 2},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": 2000, "overlap_comm": true,
                        "stage3_prefetch_bucket_size": 100000, "stage3_param_persistence_threshold": 1000,
                        "stage3_max_reuse_distance": 5000}
}]=])
set(model --n-layer 1 --n-head 2 --n-embd 32 --context 2 --corpus ${WORK}/corpus.txt --deepspeed-config ${WORK}/ds.json)
set(run --eval-batches 1 --sample 0 --threads 1)

function(summary out_var text)
  if(NOT text MATCHES "train loss [0-9.]+, validation loss [0-9.]+; loss scale ([0-9]+), ([0-9]+) steps skipped")
    message(FATAL_ERROR "no loss scale in:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_0}" PARENT_SCOPE)
  set(${out_var}_skipped "${CMAKE_MATCH_2}" PARENT_SCOPE)
endfunction()

run_program(out "${LAUNCHER}" ${model} ${run} --steps 6 --out ${WORK}/straight)
if(NOT out MATCHES "DeepSpeed config: ZeRO stage 3, ZeRO-3[(]AdamW[)] lr 0.01")
  message(FATAL_ERROR "the run should say it trains with the DeepSpeed config:\n${out}")
endif()
# The whole model's count (8192 + 64 embedding, 12,704 in the block, 64 in ln_f), not what is left
# on a rank once stage 3 has dropped the weights.
if(NOT out MATCHES "[(]21024 parameters[)]")
  message(FATAL_ERROR "the run should count every parameter of the model:\n${out}")
endif()
summary(straight "${out}")
run_program(out "${LAUNCHER}" ${model} ${run} --steps 3 --out ${WORK}/first)
summary(first "${out}")
if(first_skipped LESS 1)
  message(FATAL_ERROR "the first 3 steps skipped none, so the loss scale at the stop is the initial one and "
                      "the test shows less:\n${out}")
endif()
if(NOT EXISTS ${WORK}/first/checkpoint-engine/step3/zero_rank_1.safetensors)
  message(FATAL_ERROR "no ZeRO shard of rank 1 in ${WORK}/first/checkpoint-engine/step3")
endif()
run_program(out "${LAUNCHER}" --resume ${WORK}/first/checkpoint ${run} --steps 6 --out ${WORK}/first)
if(NOT out MATCHES "resumed at step 3")
  message(FATAL_ERROR "the run should resume at step 3:\n${out}")
endif()
summary(resumed "${out}")
if(NOT resumed STREQUAL straight)
  message(FATAL_ERROR "resumed: '${resumed}'\nstraight through: '${straight}'")
endif()
file(SHA256 ${WORK}/straight/checkpoint/model.safetensors a)
file(SHA256 ${WORK}/first/checkpoint/model.safetensors b)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "resumed and straight through, the final weights differ")
endif()
if(EXISTS ${WORK}/first/checkpoint-engine/step3)
  message(FATAL_ERROR "the engine checkpoint of step 3 should be gone once checkpoint/ is at step 6")
endif()

# The step-6 checkpoint on one rank: the two ranks' shards make one partition.
run_program(out "" --resume ${WORK}/first/checkpoint ${run} --steps 7 --out ${WORK}/first)
if(NOT out MATCHES "windows per step; DeepSpeed config.*resumed at step 6")
  message(FATAL_ERROR "the run should resume at step 6 on one rank:\n${out}")
endif()

execute_process(COMMAND ${PROGRAM} ${model} ${run} --steps 2 --lr 0.5 --out ${WORK}/conflict
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--lr and a DeepSpeed config are both given")
  message(FATAL_ERROR "--lr with --deepspeed-config should be an Error, got ${rc}:\n${err}")
endif()
file(WRITE ${WORK}/typo.json [=[{"train_batch_size": 2, "zero_optimisation": {"stage": 2}}]=])
execute_process(COMMAND ${PROGRAM} --deepspeed-config ${WORK}/typo.json --steps 1 --out ${WORK}/typo
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "typo.json: \"zero_optimisation\" is not a key Kiln knows here [(]did you mean \"zero_optimization\"")
  message(FATAL_ERROR "a misspelt key should be an Error naming it, got ${rc}:\n${err}")
endif()

# curriculum_learning and torch_autocast from the config, on one process: the engine cuts the
# windows to 2, then 4, then 8 bytes, train_gpt cuts the targets with them, and the loss is
# computed under the forward's autocast.
file(WRITE ${WORK}/curriculum.json [=[{
  "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "torch_autocast": {"enabled": true, "dtype": "bf16"},
  "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 2, "max_difficulty": 8,
                          "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [2, 4, 8], "max_step": [1, 2]}}
}]=])
execute_process(COMMAND ${PROGRAM} --n-layer 1 --n-head 2 --n-embd 32 --context 8 --corpus ${WORK}/corpus.txt
                        --deepspeed-config ${WORK}/curriculum.json ${run} --steps 4 --out ${WORK}/curriculum
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "train_gpt: 4 steps .*train loss [0-9.]+, validation loss [0-9.]+")
  message(FATAL_ERROR "curriculum_learning with torch_autocast should train (${rc}):\n${out}\n${err}")
endif()
