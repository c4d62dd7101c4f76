# InLine-PVT-Large + Semantic FPN, ADE20K 512 x 512, 40k iterations. A classification checkpoint
# initialises the backbone: backbone=dict(init_cfg=dict(type="Pretrained", checkpoint=PATH)).
_base_ = ["./_semantic_fpn.py"]
model = dict(backbone=dict(name="inline_pvt_large"))
